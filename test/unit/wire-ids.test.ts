import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ID_KINDS, SandgymError, ids, notAnId, requestFields } from '../../src/common/index.ts';
import {
  ENVS,
  NODE,
  RUNS,
  SANDBOXES,
  WireServer,
  register,
  tokenAuthenticator,
  type ServiceDef,
} from '../../src/platform/wire/index.ts';
import { requestResolution } from '../../src/platform/wire/id-resolution.ts';
import { unary } from '../../src/platform/wire/service.ts';
import { silentLogger } from '../../src/common/index.ts';

const SERVICES: ServiceDef[] = [SANDBOXES, RUNS, NODE, ENVS];
const principal = { project: 'beta', isOperator: false };

/** Every method of every service, as `Service.Method` with its definition. */
function everyMethod() {
  return SERVICES.flatMap((service) =>
    Object.entries(service.methods).map(([name, method]) => ({ where: `${service.name}.${name}`, method })),
  );
}

describe('ids in requests', () => {
  it('are declared in every field of every method: an id of a kind, a name, or not an id', () => {
    const undeclared = everyMethod().flatMap(({ where, method }) =>
      requestFields(method.request)
        .filter((field) => field.role === undefined)
        .map((field) => `${where} ${field.path.join('.')}`),
    );
    expect(undeclared).toEqual([]);
  });

  it('are the ones the threat model names, each field where a tenant can put one', () => {
    const refs = everyMethod().flatMap(({ where, method }) =>
      requestFields(method.request).flatMap(({ path, role }) =>
        role && role.role !== 'text' ? [`${where} ${path.join('.')}: ${role.role} ${role.kind}`] : [],
      ),
    );
    // the fields a hostile tenant tries (test/hostile/ids.test.ts); a new one must be added here
    expect(refs).toEqual(
      expect.arrayContaining([
        'sandgym.v1.Sandboxes.Create request.environment: ref environment',
        'sandgym.v1.Sandboxes.Create request.extraLayers.*: ref layer',
        'sandgym.v1.Sandboxes.Create request.run: ref run',
        'sandgym.v1.Sandboxes.RestoreCheckpoint checkpointId: scoped checkpoint',
        'sandgym.v1.Sandboxes.ForkInMemory checkpointId: scoped checkpoint',
        'sandgym.v1.Sandboxes.PackDiff name: name environment',
        'sandgym.v1.Sandboxes.GetEnvironment ref: ref environment',
        'sandgym.v1.Sandboxes.Step episodeId: scoped episode',
        'sandgym.v1.Runs.StartRun name: name run',
        'sandgym.v1.Runs.RenewLease name: ref run',
        'sandgym.v1.Runs.SetPhase name: ref run',
        'sandgym.v1.Runs.EndRun name: ref run',
        'sandgym.v1.Envs.Make spec.sandbox.extraLayers.*: ref layer',
        'sandgym.v1.Envs.Make spec.sandbox.environment: ref environment',
        'sandgym.v1.Envs.Make spec.sandbox.run: ref run',
        'sandgym.v1.Envs.Reset options.episodeId: scoped episode',
        'sandgym.v1.Envs.Restore checkpointId: ref envCheckpoint',
      ]),
    );
    for (const { where, method } of everyMethod()) {
      const shape = (method.request as z.ZodObject).shape;
      if ('sandboxId' in shape) expect(refs, where).toContain(`${where} sandboxId: ref sandbox`);
      if ('envId' in shape) expect(refs, where).toContain(`${where} envId: ref env`);
    }
  });

  it('are resolved wherever they sit in a request, and a refusal stops the call', async () => {
    const seen: string[] = [];
    const record = (kind: string) => (id: string, who: { project: string }) => {
      seen.push(`${who.project} ${kind} ${id}`);
      if (id.endsWith('f'.repeat(8))) throw new SandgymError('not_found', `No ${kind} ${id}`);
    };
    const resolvers = Object.fromEntries(ID_KINDS.map((kind) => [kind, record(kind)]));
    const make = requestResolution('Envs.Make', ENVS.methods.Make, resolvers);
    const layer = (n: string) => `sha256:${n.repeat(64)}`;
    await make(
      {
        spec: {
          kind: 'sandbox',
          sandbox: { environment: 'busybox:latest', extraLayers: [layer('1'), layer('2')] },
        },
      },
      principal,
    );
    expect(seen).toEqual([
      'beta environment busybox:latest',
      `beta layer ${layer('1')}`,
      `beta layer ${layer('2')}`,
    ]);
    // a task spec has no sandbox: nothing to resolve
    seen.length = 0;
    await make({ spec: { kind: 'task', path: 'hello' } }, principal);
    expect(seen).toEqual([]);
    const create = requestResolution('Sandboxes.Create', SANDBOXES.methods.Create, resolvers);
    await expect(
      create({ request: { environment: 'busybox:latest', extraLayers: [layer('f')] } }, principal),
    ).rejects.toMatchObject({ code: 'not_found' });
  });

  it('stop a server from starting when a method carries an id nothing resolves, or text nobody declared', async () => {
    const start = (service: ServiceDef) =>
      WireServer.listen('127.0.0.1:0', [register(service, { Look: () => Promise.resolve({}) })], {
        authenticate: tokenAuthenticator({ 'a-token-of-thirty-two-characters-1234': 'p' }),
        resolvers: {},
        logger: silentLogger(),
      });
    const service = (request: z.ZodType): ServiceDef => ({
      name: 'test.v1.Ids',
      methods: { Look: unary({ request, response: z.object({}), summary: 'look' }) },
    });
    await expect(start(service(z.strictObject({ sandboxId: ids.sandbox() })))).rejects.toThrow(
      /test\.v1\.Ids\.Look sandboxId is a sandbox id, and this server has no sandbox resolver/,
    );
    await expect(start(service(z.strictObject({ target: z.string() })))).rejects.toThrow(
      /test\.v1\.Ids\.Look target is a string nobody declared/,
    );
    await expect(start(service(z.strictObject({ checkpointId: ids.checkpoint() })))).rejects.toThrow(
      /scoped by a sandbox id, and the request has none/,
    );
    await expect(
      start(service(z.strictObject({ tags: z.record(ids.layer(), notAnId(z.string())) }))),
    ).rejects.toThrow(/cannot be a map key/);
  });

  it('each have a row in the security model', () => {
    const security = readFileSync(new URL('../../docs/security.md', import.meta.url), 'utf8');
    const table = security.slice(security.indexOf('## Ids'));
    for (const kind of ID_KINDS) expect(table, kind).toMatch(new RegExp(`^\\| \`${kind}\``, 'm'));
  });
});
