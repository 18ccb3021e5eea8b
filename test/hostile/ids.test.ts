import { spawnSync } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { detectCriu } from '../../src/backends/host/criu.ts';
import { isSandgymError } from '../../src/common/index.ts';
import {
  Platform,
  type RemotePlatform,
  type Sandbox,
  type SandboxRequest,
} from '../../src/platform/index.ts';
import { ENVS, NODE, RUNS, SANDBOXES, WireClient } from '../../src/platform/wire/index.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const TOKENS = { alpha: 'alpha-ids-token-4c1e9a7b3d5f2086', beta: 'beta-ids-token-8d2f6b0a4c1e9375' };
const GRANTS = {
  [TOKENS.alpha]: { project: 'alpha', maxSandboxes: 30 },
  [TOKENS.beta]: { project: 'beta', maxSandboxes: 30 },
};
const NODE_ID = 'idsnode';
const BUSYBOX = 'busybox:latest';
const SECRET = 'alpha only\n';

// memory checkpoints of containers need CRIU 4.1 (`sandgym setup --criu`)
const criu = await detectCriu();

type Project = 'alpha' | 'beta';
/** The two ways a tenant reaches a node: through the controller, or straight to the node as the controller does. */
type Door = 'controller' | 'node';
const DOORS: Door[] = ['controller', 'node'];

/** What an id that was never made looks like next to a real one, for each kind. */
const NEVER = {
  sandbox: `sg-${NODE_ID}-000000000000`,
  checkpoint: 'ckpt-000000000000',
  layer: `sha256:${'0'.repeat(64)}`,
  environment: 'never-made:v1',
  env: `env-${NODE_ID}-000000000000`,
  envCheckpoint: 'ckpt-0000000000000000',
  run: 'never-started',
};

/** A sandbox env served by the node over `sandbox`, made, reset once and closed. */
async function served(envs: WireClient<typeof ENVS>, sandbox: SandboxRequest): Promise<void> {
  const { envId } = await envs.call('Make', { spec: { kind: 'sandbox', sandbox } });
  try {
    await envs.call('Reset', { envId });
  } finally {
    await envs.call('Close', { envId });
  }
}

/** The failure of `work`, which must fail. */
async function failureOf(work: Promise<unknown>): Promise<Error & { code: string }> {
  const error: unknown = await work.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isSandgymError(error), `expected a refusal, got ${String(error)}`).toBe(true);
  return error as Error & { code: string };
}

/**
 * Expects `attempt(id)` with another project's `id` to fail exactly as it does with an id that was
 * never made: `not_found`, with the same message but for the id, so nothing confirms it exists.
 */
async function expectNoSuch(
  attempt: (id: string) => Promise<unknown>,
  theirs: string,
  never: string,
  what: string,
): Promise<void> {
  const [their, none] = [await failureOf(attempt(theirs)), await failureOf(attempt(never))];
  expect(their.code, `${what}: ${their.message}`).toBe('not_found');
  expect(none.code, `${what}: ${none.message}`).toBe('not_found');
  expect(their.message.replaceAll(theirs, 'ID'), what).toBe(none.message.replaceAll(never, 'ID'));
}

/**
 * Ids are capabilities only for their owner: two projects behind a controller and one node (which
 * also serves Envs), and every id one project holds (sandbox, checkpoint, layer digest,
 * environment, env, run, episode) tried by the other in every field of every method, through the
 * controller and straight to the node. Each attack has its honest twin: the owner's own use works.
 */
describe('ids under hostile tenants', () => {
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;
  const platforms = {} as Record<Door, Record<Project, RemotePlatform>>;
  const sandboxClients = {} as Record<Door, Record<Project, WireClient<typeof SANDBOXES>>>;
  const runClients = {} as Record<Door, Record<Project, WireClient<typeof RUNS>>>;
  const envClients = {} as Record<Project, WireClient<typeof ENVS>>;
  const closers: (() => unknown)[] = [];
  let nodeAddress: string;
  /** Alpha's sandbox with a secret in it, and what alpha made of it. */
  let secretBox: Sandbox;
  let alphaLayer: string;
  let alphaEnvironment: { ref: string; topLayer: string };
  /** The operator's: a shared environment's layer (every project's), and a layer nothing names (nobody's). */
  let sharedLayer: string;
  let unnamedLayer: string;

  beforeAll(async () => {
    nodeData = await createTestPlatform('hostile-ids', { privateStore: true });
    const taskRoot = join(nodeData.dataDir, 'tasks');
    await mkdir(taskRoot, { recursive: true });
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir: join(nodeData.dataDir, 'store'),
      nodeId: NODE_ID,
      grants: GRANTS,
      envs: { taskRoot },
    });
    nodeAddress = `127.0.0.1:${cluster.node.port}`;
    const store = cluster.nodePlatform.layers;
    const tools = join(nodeData.dataDir, 'tools');
    await mkdir(join(tools, 'opt'), { recursive: true });
    await writeFile(join(tools, 'opt', 'tool.txt'), 'shared\n');
    sharedLayer = (await store.addLayerFromDirectory(tools, 'the operator: shared tools')).digest;
    await store.putEnvironment({ name: 'shared-tools', version: 'v1', layers: [sharedLayer], config: {} });
    await writeFile(join(tools, 'opt', 'tool.txt'), 'unnamed\n');
    unnamedLayer = (await store.addLayerFromDirectory(tools, 'the operator: a layer of no environment'))
      .digest;
    const controllerAddress = `127.0.0.1:${cluster.controller.port}`;
    for (const door of DOORS) {
      platforms[door] = {} as Record<Project, RemotePlatform>;
      sandboxClients[door] = {} as Record<Project, WireClient<typeof SANDBOXES>>;
      runClients[door] = {} as Record<Project, WireClient<typeof RUNS>>;
      for (const project of ['alpha', 'beta'] as const) {
        const [address, options] =
          door === 'controller'
            ? [controllerAddress, { token: TOKENS[project] }]
            : [nodeAddress, { token: IN_PROCESS_NODE_TOKEN, metadata: { 'sandgym-project': project } }];
        const platform = await Platform.connect(`grpc://${address}`, options);
        const sandboxes = new WireClient(address, SANDBOXES, options);
        const runs = new WireClient(address, RUNS, options);
        platforms[door][project] = platform;
        sandboxClients[door][project] = sandboxes;
        runClients[door][project] = runs;
        closers.push(
          () => platform.close(),
          () => sandboxes.close(),
          () => runs.close(),
        );
      }
    }
    for (const project of ['alpha', 'beta'] as const) {
      const envs = new WireClient(nodeAddress, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { 'sandgym-project': project },
      });
      envClients[project] = envs;
      closers.push(() => envs.close());
    }
    const alpha = platforms.controller.alpha;
    secretBox = await alpha.createSandbox({ environment: BUSYBOX });
    await secretBox.writeFile('/secret.txt', SECRET);
    alphaLayer = (await alpha.packDiff(secretBox, {})).layer.digest;
    const packed = await alpha.packDiff(secretBox, { name: 'alpha-secret:v1' });
    await alpha.packDiff(secretBox, { name: 'alpha-secret:latest' });
    alphaEnvironment = { ref: 'alpha-secret:v1', topLayer: packed.environment!.layers.at(-1)! };
  });

  afterAll(async () => {
    for (const step of [
      ...closers.reverse(),
      () => cluster?.close(),
      async () => nodeData?.[Symbol.asyncDispose](),
    ]) {
      await Promise.resolve()
        .then(step)
        .catch((error: unknown) => console.error(error));
    }
  });

  it("refuses one project's sandbox ids to another in every method that takes one", () =>
    attack('ids', "use another project's sandbox id", async () => {
      const id = secretBox.id;
      const requests: Record<string, (sandboxId: string) => unknown> = {
        Describe: (sandboxId) => ({ sandboxId }),
        Exec: (sandboxId) => ({ sandboxId, argv: ['cat', '/secret.txt'] }),
        ExecCollected: (sandboxId) => ({ sandboxId, argv: ['cat', '/secret.txt'] }),
        ReadFile: (sandboxId) => ({ sandboxId, path: '/secret.txt' }),
        WriteFile: (sandboxId) => ({ sandboxId, path: '/secret.txt', data: Buffer.from('forged') }),
        ListDir: (sandboxId) => ({ sandboxId, path: '/' }),
        Pause: (sandboxId) => ({ sandboxId }),
        Resume: (sandboxId) => ({ sandboxId }),
        Hibernate: (sandboxId) => ({ sandboxId }),
        Checkpoint: (sandboxId) => ({ sandboxId }),
        RestoreCheckpoint: (sandboxId) => ({ sandboxId, checkpointId: NEVER.checkpoint }),
        ForkInMemory: (sandboxId) => ({ sandboxId, count: 1 }),
        Stats: (sandboxId) => ({ sandboxId }),
        WrittenPaths: (sandboxId) => ({ sandboxId, prefixes: ['/'] }),
        SetNetwork: (sandboxId) => ({ sandboxId, rules: [] }),
        Destroy: (sandboxId) => ({ sandboxId }),
        PackDiff: (sandboxId) => ({ sandboxId, name: 'stolen:v1' }),
        Step: (sandboxId) => ({
          sandboxId,
          episodeId: 'e1',
          stepIndex: 0,
          action: { type: 'read_file', path: '/secret.txt' },
        }),
        Trajectory: (sandboxId) => ({ sandboxId }),
      };
      // every method whose request names a sandbox is tried: a new one must join this table
      const taking = Object.entries(SANDBOXES.methods)
        .filter(([, method]) => 'sandboxId' in (method.request as z.ZodObject).shape)
        .map(([name]) => name);
      expect(Object.keys(requests).sort()).toEqual(taking.sort());
      for (const door of DOORS) {
        const beta = sandboxClients[door].beta;
        for (const [method, request] of Object.entries(requests)) {
          const attempt = (sandboxId: string): Promise<unknown> =>
            method === 'Exec'
              ? (async () => {
                  for await (const event of beta.stream('Exec', request(sandboxId))) void event;
                })()
              : beta.call(method as 'Describe', request(sandboxId));
          await expectNoSuch(attempt, id, NEVER.sandbox, `${door} ${method}`);
        }
        // nor is it listed to them
        expect((await platforms[door].beta.listSandboxes()).map((r) => r.id)).not.toContain(id);
      }
      // honest twin: alpha's sandbox is untouched, and alpha reaches it through both doors
      for (const door of DOORS) {
        const mine = await platforms[door].alpha.attachSandbox(id);
        expect((await mine.readFile('/secret.txt')).toString()).toBe(SECRET);
      }
      expect((await secretBox.exec(['ls', '/'])).stdout).not.toMatch(/stolen/);
    }));

  it.skipIf(!criu.usable)("refuses one project's memory checkpoints to another: no fork, no restore", () =>
    attack('ids', "fork or restore another project's checkpoint", async () => {
      const checkpoint = await secretBox.checkpoint();
      for (const door of DOORS) {
        const beta = sandboxClients[door].beta;
        await using own = await platforms[door].beta.createSandbox({ environment: BUSYBOX });
        await expectNoSuch(
          (checkpointId) => beta.call('ForkInMemory', { sandboxId: own.id, count: 1, checkpointId }),
          checkpoint.id,
          NEVER.checkpoint,
          `${door} ForkInMemory`,
        );
        await expectNoSuch(
          (checkpointId) => beta.call('RestoreCheckpoint', { sandboxId: own.id, checkpointId }),
          checkpoint.id,
          NEVER.checkpoint,
          `${door} RestoreCheckpoint`,
        );
        expect((await own.exec(['cat', '/secret.txt'])).exitCode).not.toBe(0);
      }
      // honest twin: alpha forks from its own checkpoint and goes back to it
      for (const door of DOORS) {
        const alpha = platforms[door].alpha;
        const mine = await alpha.attachSandbox(secretBox.id);
        await using group = await alpha.fork(mine, 1, { depth: 'memory', checkpoint });
        expect((await group.sandboxes[0]!.readFile('/secret.txt')).toString()).toBe(SECRET);
        await mine.restore(checkpoint.id);
        expect((await mine.readFile('/secret.txt')).toString()).toBe(SECRET);
      }
    }),
  );

  it("refuses one project's layer digests to another: extraLayers, directly and in served envs", () =>
    attack('ids', "stack another project's layer digest", async () => {
      const theirs = [alphaLayer, alphaEnvironment.topLayer, unnamedLayer];
      for (const door of DOORS) {
        const beta = platforms[door].beta;
        for (const digest of theirs) {
          await expectNoSuch(
            (layer) => beta.createSandbox({ environment: BUSYBOX, extraLayers: [layer] }),
            digest,
            NEVER.layer,
            `${door} Create extraLayers`,
          );
          // hidden among layers it may use
          await expectCode(
            beta.createSandbox({ environment: BUSYBOX, extraLayers: [sharedLayer, digest] }),
            'not_found',
          );
        }
      }
      // the node's Envs service: a sandbox env over the layer
      const envs = envClients.beta;
      for (const digest of theirs) {
        await expectNoSuch(
          (layer) => served(envs, { environment: BUSYBOX, extraLayers: [layer] }),
          digest,
          NEVER.layer,
          'Envs.Make extraLayers',
        );
      }
      // honest twins: alpha stacks its own layers; beta stacks a shared one and one it made
      for (const door of DOORS) {
        for (const digest of [alphaLayer, alphaEnvironment.topLayer]) {
          await using mine = await platforms[door].alpha.createSandbox({
            environment: BUSYBOX,
            extraLayers: [digest],
          });
          expect((await mine.readFile('/secret.txt')).toString()).toBe(SECRET);
        }
        const beta = platforms[door].beta;
        await using made = await beta.createSandbox({ environment: BUSYBOX });
        await made.writeFile('/beta.txt', 'beta\n');
        const { layer } = await beta.packDiff(made, {});
        await using stacked = await beta.createSandbox({
          environment: BUSYBOX,
          extraLayers: [sharedLayer, layer.digest],
        });
        expect((await stacked.readFile('/beta.txt')).toString()).toBe('beta\n');
        expect((await stacked.readFile('/opt/tool.txt')).toString()).toBe('shared\n');
      }
    }));

  it("refuses one project's environments to another, by any spelling of their name", () =>
    attack('ids', "boot or read another project's environment", async () => {
      const refs = [alphaEnvironment.ref, 'alpha-secret', 'alpha-secret:latest'];
      for (const door of DOORS) {
        const beta = platforms[door].beta;
        for (const ref of refs) {
          await expectNoSuch(
            (environment) => beta.createSandbox({ environment }),
            ref,
            NEVER.environment,
            `${door} Create environment`,
          );
          await expectNoSuch(
            (name) => beta.getEnvironment(name),
            ref,
            NEVER.environment,
            `${door} GetEnvironment`,
          );
        }
        await expectCode(
          beta.createSandbox({ environment: `sha256:${alphaEnvironment.topLayer.slice(7)}` }),
          'not_found',
        );
        expect((await beta.listEnvironments()).map((e) => e.name)).not.toContain('alpha-secret');
      }
      for (const ref of refs) {
        await expectNoSuch(
          (environment) => served(envClients.beta, { environment }),
          ref,
          NEVER.environment,
          'Envs.Make environment',
        );
      }
      // honest twins: alpha boots its own, beta boots the shared base
      for (const door of DOORS) {
        await using mine = await platforms[door].alpha.createSandbox({ environment: alphaEnvironment.ref });
        expect((await mine.readFile('/secret.txt')).toString()).toBe(SECRET);
        await using shared = await platforms[door].beta.createSandbox({ environment: BUSYBOX });
        expect((await shared.exec(['echo', 'ok'])).stdout).toBe('ok\n');
      }
    }));

  it("refuses one project's served envs and env checkpoints to another", () =>
    attack('ids', "drive another project's env or restore its env checkpoint", async () => {
      const alpha = envClients.alpha;
      const beta = envClients.beta;
      const spec = { kind: 'sandbox', sandbox: { environment: BUSYBOX } } as const;
      const { envId } = await alpha.call('Make', { spec });
      const own = await beta.call('Make', { spec });
      try {
        await alpha.call('Reset', { envId });
        await alpha.call('Step', {
          envId,
          stepIndex: 0,
          action: { type: 'write_file', path: '/root/s', content: 'alpha env secret' },
        });
        const { checkpointId } = await alpha.call('Checkpoint', { envId });
        const requests: Record<string, (id: string) => unknown> = {
          Reset: (id) => ({ envId: id }),
          Step: (id) => ({ envId: id, stepIndex: 1, action: { type: 'read_file', path: '/root/s' } }),
          Checkpoint: (id) => ({ envId: id }),
          Restore: (id) => ({ envId: id, checkpointId: NEVER.envCheckpoint }),
          Close: (id) => ({ envId: id }),
          ChatReset: (id) => ({ envId: id }),
          ChatStep: (id) => ({ envId: id, turn: 0, answer: 'read it' }),
          ChatRestore: (id) => ({ envId: id, checkpointId: NEVER.envCheckpoint }),
        };
        const taking = Object.entries(ENVS.methods)
          .filter(([, method]) => 'envId' in (method.request as z.ZodObject).shape)
          .map(([name]) => name);
        expect(Object.keys(requests).sort()).toEqual(taking.sort());
        for (const [method, request] of Object.entries(requests))
          await expectNoSuch(
            (id) => beta.call(method as 'Reset', request(id)),
            envId,
            NEVER.env,
            `Envs.${method}`,
          );
        await beta.call('Reset', { envId: own.envId });
        await expectNoSuch(
          (id) => beta.call('Restore', { envId: own.envId, checkpointId: id }),
          checkpointId,
          NEVER.envCheckpoint,
          'Envs.Restore checkpointId',
        );
        await expectNoSuch(
          (id) => beta.call('ChatRestore', { envId: own.envId, checkpointId: id }),
          checkpointId,
          NEVER.envCheckpoint,
          'Envs.ChatRestore checkpointId',
        );
        // a fork made beside another project's env: as if that env were never made
        await expectNoSuch(
          (id) => beta.call('Make', { spec, beside: id }),
          envId,
          NEVER.env,
          'Envs.Make beside',
        );
        // honest twin: alpha's episode goes on, and its checkpoint restores
        const read = await alpha.call('Step', {
          envId,
          stepIndex: 1,
          action: { type: 'read_file', path: '/root/s' },
        });
        expect(read.observation).toMatchObject({ content: 'alpha env secret' });
        await alpha.call('Restore', { envId, checkpointId });
      } finally {
        await alpha.call('Close', { envId });
        await beta.call('Close', { envId: own.envId });
      }
    }));

  it("refuses one project's runs to another: renew, phase, end, join", () =>
    attack('ids', "govern or join another project's run", async () => {
      const alphaRun = await platforms.controller.alpha.startRun({ name: 'shared-name', leaseMs: 600_000 });
      await using member = await platforms.controller.alpha.createSandbox({
        environment: BUSYBOX,
        run: 'shared-name',
      });
      try {
        for (const door of DOORS) {
          const runs = runClients[door].beta;
          const attempts: Record<string, (name: string) => Promise<unknown>> = {
            RenewLease: (name) => runs.call('RenewLease', { name }),
            SetPhase: (name) => runs.call('SetPhase', { name, phase: 'preempted' }),
            EndRun: (name) => runs.call('EndRun', { name }),
            'Create run': (run) => platforms[door].beta.createSandbox({ environment: BUSYBOX, run }),
          };
          for (const [what, attempt] of Object.entries(attempts))
            await expectNoSuch(attempt, 'shared-name', NEVER.run, `${door} ${what}`);
          // starting a run of the same name makes beta a run of its own, which it may end
          await runs.call('StartRun', { name: 'shared-name', leaseMs: 600_000 });
          expect((await runs.call('EndRun', { name: 'shared-name' })).destroyed).toEqual([]);
        }
        await expectNoSuch(
          (run) => served(envClients.beta, { environment: BUSYBOX, run }),
          'shared-name',
          NEVER.run,
          'Envs.Make run',
        );
        // honest twin: alpha's run and its sandbox are as they were, and alpha governs them
        expect((await member.exec(['echo', 'alive'])).stdout).toBe('alive\n');
        const renewed = await alphaRun.renew();
        expect(renewed).toMatchObject({ phase: 'rollout', lapsed: false, sandboxes: 1 });
      } finally {
        await alphaRun.end();
      }
    }));

  it("keeps one project's episodes its own: a step with their episode id runs in its own sandbox only", () =>
    attack('ids', "replay or read another project's episode", async () => {
      const alpha = platforms.controller.alpha;
      const episodeId = 'alpha-episode';
      const first = await alpha.step(secretBox, {
        episodeId,
        stepIndex: 0,
        action: { type: 'read_file', path: '/secret.txt' },
      });
      expect(first.result.observation).toMatchObject({ content: SECRET });
      for (const door of DOORS) {
        const beta = sandboxClients[door].beta;
        await using own = await platforms[door].beta.createSandbox({ environment: BUSYBOX });
        // the same episode and index in its own sandbox: its own step, never alpha's record
        const mine = await beta.call('Step', {
          sandboxId: own.id,
          episodeId,
          stepIndex: 0,
          action: { type: 'read_file', path: '/secret.txt' },
        });
        expect(mine.replayed).toBe(false);
        expect(JSON.stringify(mine.result)).not.toContain('alpha only');
        await expectNoSuch(
          (sandboxId) => beta.call('Trajectory', { sandboxId }),
          secretBox.id,
          NEVER.sandbox,
          `${door} Trajectory`,
        );
        const records = (await beta.call('Trajectory', { sandboxId: own.id })).records;
        expect(JSON.stringify(records)).not.toContain('alpha only');
      }
      // a served env named with alpha's episode id is beta's own episode
      const { envId } = await envClients.beta.call('Make', {
        spec: { kind: 'sandbox', sandbox: { environment: BUSYBOX } },
      });
      try {
        const reset = await envClients.beta.call('Reset', { envId, options: { episodeId } });
        expect(reset.info).toMatchObject({ episodeId });
        expect(JSON.stringify(reset)).not.toContain(secretBox.id);
      } finally {
        await envClients.beta.call('Close', { envId });
      }
      // honest twin: alpha's retry of its step answers with alpha's record
      const again = await alpha.step(secretBox, {
        episodeId,
        stepIndex: 0,
        action: { type: 'read_file', path: '/secret.txt' },
      });
      expect(again.replayed).toBe(true);
      expect(again.result.observation).toMatchObject({ content: SECRET });
    }));

  it("keeps the node's operator methods from tenants: gc reaps only the caller's own, drain is the operator's", () =>
    attack('ids', 'node-wide gc and drain with a tenant token', async () => {
      // alpha's sandbox whose owner died on the node's host: residue only alpha or the operator reaps
      const orphan = orphanOf('alpha');
      const recorded = async (): Promise<string[]> =>
        (await platforms.controller.alpha.listSandboxes()).map((record) => record.id);
      expect(await recorded()).toContain(orphan);
      for (const door of DOORS) {
        const report = await platforms[door].beta.gc();
        expect(report.sandboxes).not.toContain(orphan);
        expect(report.mounts).toEqual([]);
        expect(report.cgroups).toEqual([]);
      }
      expect(await recorded()).toContain(orphan);
      // the Node service is the operator's: never a tenant's, through the node or the controller
      const asTenant = new WireClient(nodeAddress, NODE, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { 'sandgym-project': 'beta' },
      });
      const throughController = new WireClient(`127.0.0.1:${cluster.controller.port}`, NODE, {
        token: TOKENS.beta,
      });
      try {
        for (const method of ['Undrain', 'Status'] as const)
          await expectCode(asTenant.call(method, {}), 'permission_denied', /operator/);
        const drain = async (): Promise<void> => {
          for await (const progress of asTenant.stream('Drain', {})) void progress;
        };
        await expectCode(drain(), 'permission_denied', /operator/);
        expect(cluster.node.status().draining).toBe(false);
        await expectCode(throughController.call('Undrain', {}), 'unsupported');
      } finally {
        asTenant.close();
        throughController.close();
      }
      // honest twins: alpha's gc reaps alpha's residue; the operator's Status and Undrain work
      const reaped = await platforms.controller.alpha.gc();
      expect(reaped.sandboxes).toContain(orphan);
      expect(await recorded()).not.toContain(orphan);
      const operator = new WireClient(nodeAddress, NODE, { token: IN_PROCESS_NODE_TOKEN });
      try {
        expect((await operator.call('Status', {})).nodeId).toBe(NODE_ID);
        expect((await operator.call('Undrain', {})).draining).toBe(false);
      } finally {
        operator.close();
      }
    }));

  /**
   * A sandbox of `project` on the node whose owner process died: another process on the node's
   * host (a crashed `sandgym run`, say) made it on the node's data dir and exited without closing it.
   */
  function orphanOf(project: Project): string {
    const made = spawnSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `
const { Platform } = await import(${JSON.stringify(resolve('dist/src/index.js'))});
const platform = await Platform.local({
  dataDir: process.env.DATA, storeDir: process.env.STORE, nodeId: ${JSON.stringify(NODE_ID)},
  project: ${JSON.stringify(project)}, durable: true,
});
const sandbox = await platform.createSandbox({ environment: ${JSON.stringify(BUSYBOX)} });
console.log(JSON.stringify({ id: sandbox.id }));
process.exit(0);
`,
      ],
      {
        env: { ...process.env, DATA: join(nodeData.dataDir, 'node'), STORE: join(nodeData.dataDir, 'store') },
        encoding: 'utf8',
        timeout: 120_000,
      },
    );
    expect(made.status, made.stderr).toBe(0);
    return (JSON.parse(made.stdout.trim().split('\n').at(-1)!) as { id: string }).id;
  }
});
