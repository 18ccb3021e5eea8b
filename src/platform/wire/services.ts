import * as e from './env-messages.ts';
import * as m from './messages.ts';
import { serverStream, unary, type ServiceDef } from './service.ts';

const MAX_FILE_MESSAGE = 65 * 1024 * 1024;

/**
 * Sandboxes: what a client drives. Node agents serve it for their own sandboxes; controllers serve
 * it for the cluster, routing each sandbox call to the node its id names.
 */
export const SANDBOXES = {
  name: 'sandgym.v1.Sandboxes',
  methods: {
    Create: unary({ request: m.createRequest, response: m.sandboxInfo, summary: 'create a sandbox' }),
    Describe: unary({
      request: m.sandboxRef,
      response: m.sandboxInfo,
      summary: 'one sandbox: state, layers, labels',
    }),
    Exec: serverStream({
      request: m.execRequest,
      response: m.execEvent,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: 'run a command: output chunks as they arrive, then its result',
    }),
    ExecCollected: unary({
      request: m.execRequest,
      response: m.execResult,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: 'run a command and return its result with the captured output (one round trip)',
    }),
    ReadFile: unary({ request: m.readFileRequest, response: m.fileData, summary: 'read a file' }),
    WriteFile: unary({
      request: m.writeFileRequest,
      response: m.empty,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: 'write a file (parents created)',
    }),
    ListDir: unary({ request: m.listDirRequest, response: m.dirEntries, summary: 'list a directory' }),
    Pause: unary({ request: m.sandboxRef, response: m.empty, summary: 'freeze every process' }),
    Resume: unary({ request: m.sandboxRef, response: m.empty, summary: 'thaw (paused or hibernated)' }),
    Hibernate: unary({
      request: m.sandboxRef,
      response: m.hibernateReport,
      summary: 'freeze, then push its memory out; any request resumes it',
    }),
    Checkpoint: unary({
      request: m.checkpointRequest,
      response: m.sandboxCheckpoint,
      summary: 'save its processes, memory and files on its node (microVMs, VMs, CRIU containers)',
    }),
    RestoreCheckpoint: unary({
      request: m.restoreCheckpointRequest,
      response: m.empty,
      summary: 'go back to one of its checkpoints, in place',
    }),
    ForkInMemory: unary({
      request: m.forkInMemoryRequest,
      response: m.sandboxInfos,
      summary: 'count new sandboxes on its node that carry on from its processes and memory',
    }),
    Stats: unary({ request: m.sandboxRef, response: m.sandboxStats, summary: 'measured use' }),
    WrittenPaths: unary({
      request: m.writtenPathsRequest,
      response: m.writtenPaths,
      summary: 'what its writable layer holds under some paths (the audit of protected paths)',
    }),
    SetNetwork: unary({
      request: m.setNetworkRequest,
      response: m.empty,
      summary: 'replace its network rules (a stage boundary); empty is loopback only',
    }),
    Destroy: unary({ request: m.sandboxRef, response: m.empty, summary: 'destroy (idempotent)' }),
    List: unary({
      request: m.empty,
      response: m.sandboxRecords,
      summary: "the caller's project's sandboxes",
    }),
    PackDiff: unary({
      request: m.packDiffRequest,
      response: m.packDiffResult,
      summary: "a sandbox's changes as a layer and a new environment",
    }),
    ListEnvironments: unary({
      request: m.empty,
      response: m.environments,
      summary: 'environments in the store',
    }),
    GetEnvironment: unary({
      request: m.environmentRef,
      response: m.environmentMessage,
      summary: 'one environment, name:version',
    }),
    Step: unary({
      request: m.stepRequest,
      response: m.stepReply,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: 'one env step, exactly once: run, audited and recorded on the node before the answer',
    }),
    Trajectory: unary({
      request: m.sandboxRef,
      response: m.trajectory,
      summary: "a sandbox's trajectory log",
    }),
    Gc: unary({
      request: m.empty,
      response: m.gcReport,
      summary:
        "reap what crashed owners left: the caller's project's sandboxes (all of the node's residue for its operator)",
    }),
    LayerGc: unary({
      request: m.layerGcRequest,
      response: m.layerGcReport,
      summary: 'unused mounts and layers',
    }),
  },
} satisfies ServiceDef;

/**
 * Runs: a trainer's lease over its sandboxes and the training phase they follow. Runs live on
 * the node agents (a controller fans each call out to every node and merges the answers).
 */
export const RUNS = {
  name: 'sandgym.v1.Runs',
  methods: {
    StartRun: unary({
      request: m.startRunRequest,
      response: m.runStatus,
      summary: 'start (or rejoin) a run',
    }),
    RenewLease: unary({ request: m.runRef, response: m.runStatus, summary: "extend the run's lease" }),
    SetPhase: unary({
      request: m.setPhaseRequest,
      response: m.phaseReport,
      summary: 'apply the phase policy to the run’s sandboxes',
    }),
    EndRun: unary({
      request: m.runRef,
      response: m.endRunReport,
      summary: 'destroy everything the run owns',
    }),
  },
} satisfies ServiceDef;

/**
 * Node: what controllers' watchers and the node's operator ask a node agent besides sandbox calls.
 * Node-wide, so the operator's alone (the node token, acting for no project).
 */
export const NODE = {
  name: 'sandgym.v1.Node',
  methods: {
    Status: unary({
      request: m.empty,
      response: m.nodeStatus,
      access: 'operator',
      summary: 'load, capacity and health',
    }),
    Drain: serverStream({
      request: m.drainRequest,
      response: m.drainProgress,
      access: 'operator',
      summary: 'stop placement here; stream progress until no sandbox is left running',
    }),
    Undrain: unary({
      request: m.empty,
      response: m.nodeStatus,
      access: 'operator',
      summary: 'take new sandboxes again',
    }),
  },
} satisfies ServiceDef;

/**
 * Envs: gym environments served by a node agent. A client makes one (over a fresh sandbox per
 * episode, or a task's, graded on the node), then resets and steps it in one call each.
 */
export const ENVS = {
  name: 'sandgym.v1.Envs',
  methods: {
    Make: unary({
      request: e.makeEnvRequest,
      response: e.envHandle,
      summary: 'make an env (no sandbox yet)',
    }),
    Reset: unary({
      request: e.envResetRequest,
      response: e.envResetReply,
      summary: 'start an episode in a fresh sandbox',
    }),
    Step: unary({
      request: e.envStepRequest,
      response: e.envStepReply,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: 'one step, exactly once; a task env grades on submit',
    }),
    Checkpoint: unary({
      request: e.envCheckpointRequest,
      response: e.envCheckpointReply,
      summary: "save the episode's state as an environment",
    }),
    Restore: unary({
      request: e.envRestoreRequest,
      response: e.envResetReply,
      summary: 'go on from a checkpoint in a new sandbox',
    }),
    Close: unary({ request: e.envRef, response: m.empty, summary: 'destroy the env and its sandbox' }),
    ChatReset: unary({
      request: e.chatResetRequest,
      response: e.chatResetReply,
      summary: 'start a chat episode: the opening messages and the tools',
    }),
    ChatStep: unary({
      request: e.chatStepRequest,
      response: e.chatStepReply,
      maxRequestBytes: MAX_FILE_MESSAGE,
      summary: "one turn: the model's answer in, its tool calls run in order, tool messages out",
    }),
    ChatRestore: unary({
      request: e.chatRestoreRequest,
      response: e.chatResetReply,
      summary: 'a chat episode again from its checkpoint, in this env: how groups fork one episode',
    }),
  },
} satisfies ServiceDef;
