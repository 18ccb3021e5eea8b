/** Shared foundations: errors, ids, the wire codec, the logger and validation helpers. */
export { SANDGYM_ERROR_CODES, SandgymError, isSandgymError, messageOf } from './errors.ts';
export type { SandgymErrorCode, FailureReason, SandgymErrorOptions } from './errors.ts';
export { newSandboxId, isSandboxId, nodeOfSandboxId, nodeScopedId } from './ids.ts';
export { createMsgpackCodec } from './codec.ts';
export type { Codec } from './codec.ts';
export { LOG_LEVELS, createLogger, silentLogger } from './logger.ts';
export type { LogLevel, Logger, LoggerOptions } from './logger.ts';
export { ENV_VAR_NAME, climbsOut, parseAt, pathInTree, textWithoutNul } from './validation.ts';
export { ID_KINDS, ids, names, notAnId, requestFields } from './id-fields.ts';
export type { FieldRole, IdKind, RequestField } from './id-fields.ts';
export { writeFileAtomic, writeSmallFileAtomicNow } from './atomic-file.ts';
export { settleAll } from './settle-all.ts';
export { ConcurrencyLimit } from './concurrency-limit.ts';
export { AsyncQueue } from './async-queue.ts';
export { definedFields } from './defined-fields.ts';
export type { DefinedFields } from './defined-fields.ts';
export { faultPoint } from './fault-points.ts';
export { abortable } from './abortable.ts';
