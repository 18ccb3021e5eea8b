import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  ENVS,
  NODE,
  RUNS,
  SANDBOXES,
  STATUS_OF_CODE,
  decodeMessage,
  encodeMessage,
  type ServiceDef,
} from '../../src/platform/wire/index.ts';
import { sandboxActionSchema } from '../../src/platform/index.ts';

const doc = readFileSync(new URL('../../docs/wire.md', import.meta.url), 'utf8');
const SERVICES: Record<string, ServiceDef> = { Sandboxes: SANDBOXES, Runs: RUNS, Node: NODE, Envs: ENVS };

/** The golden blocks of the doc: "```json golden Service.Method request|response". */
function goldens(): { service: string; method: string; side: 'request' | 'response'; body: string }[] {
  return [...doc.matchAll(/```json golden (\w+)\.(\w+) (request|response)\n([\s\S]*?)```/g)].map((m) => ({
    service: m[1]!,
    method: m[2]!,
    side: m[3] as 'request' | 'response',
    body: m[4]!,
  }));
}

describe('docs/wire.md', () => {
  it('lists every service, method and error code the code defines', () => {
    for (const service of Object.values(SERVICES)) {
      expect(doc).toContain(service.name);
      for (const method of Object.keys(service.methods)) expect(doc, method).toContain(`\`${method}\``);
    }
    for (const code of Object.keys(STATUS_OF_CODE)) expect(doc, code).toContain(`\`${code}\``);
  });

  it('shows golden messages that the schemas accept as they are, through msgpack', () => {
    const found = goldens();
    expect(found.map((g) => `${g.service}.${g.method} ${g.side}`)).toEqual(
      expect.arrayContaining(['Sandboxes.Step request', 'Envs.Reset response', 'Envs.Step response']),
    );
    for (const golden of found) {
      const method = SERVICES[golden.service]?.methods[golden.method];
      expect(method, `${golden.service}.${golden.method}`).toBeDefined();
      const value = JSON.parse(golden.body) as unknown;
      const decoded = decodeMessage(method![golden.side], encodeMessage(value), 1 << 20, golden.method);
      // requests are strict (an unknown field throws): what the golden says, it keeps
      if (golden.side === 'request') expect(decoded).toMatchObject(value as object);
      const action = (value as { action?: unknown }).action;
      if (action !== undefined) expect(sandboxActionSchema.safeParse(action).success).toBe(true);
    }
  });
});
