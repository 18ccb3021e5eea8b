import type { Etcd3, IKeyValue, Watcher } from 'etcd3';
import { z } from 'zod';
import { SandgymError, type Logger } from '../../common/index.ts';
import type { RunManager, RunOptions, SharedRun, TrainingPhase } from '../runs.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';

/**
 * A run in etcd is two keys under `runs/<project>/<name>/`: `record` (its settings and phase,
 * kept through the grace) and `lease` (on an etcd lease of the run's length). A renewal moves
 * `lease` onto a fresh etcd lease; when the trainer stops renewing, etcd deletes `lease`, and
 * every node hears it at once. One prefix holds both, so a watcher sees their changes in order.
 */
const RUNS_PREFIX = `${ETCD_PREFIX}runs/`;
const recordKey = (project: string, name: string): string => `${RUNS_PREFIX}${project}/${name}/record`;
const leaseKey = (project: string, name: string): string => `${RUNS_PREFIX}${project}/${name}/lease`;

const sharedRunSchema = z.object({
  name: z.string().min(1),
  leaseMs: z.number().int().positive(),
  ttlMs: z.number().int().nonnegative(),
  phase: z.enum(['rollout', 'weight_sync', 'train', 'preempted', 'resumed']),
});

/** The whole-second etcd lease for a run lease of `leaseMs` (etcd counts in seconds). */
const leaseSeconds = (leaseMs: number): number => Math.max(1, Math.ceil(leaseMs / 1000));

function parseKey(key: string): { project: string; name: string; part: 'record' | 'lease' } | undefined {
  const match = /^([^/]+)\/([^/]+)\/(record|lease)$/.exec(key.slice(RUNS_PREFIX.length));
  return match ? { project: match[1]!, name: match[2]!, part: match[3] as 'record' | 'lease' } : undefined;
}

/**
 * Runs as controllers keep them in etcd: every change is one transaction, so replicas agree on
 * each run's settings, phase and lease whichever of them a trainer reaches.
 */
export class RunLedger {
  constructor(private readonly etcd: Etcd3) {}

  /**
   * Starts a run, or joins it: its settings are replaced, its phase kept, and its lease renewed,
   * all in one transaction, so no node ever sees the run without a live lease.
   */
  async start(project: string, options: RunOptions): Promise<void> {
    const key = recordKey(project, options.name);
    for (;;) {
      const existing = await this.read(project, options.name);
      const record: SharedRun = {
        name: options.name,
        leaseMs: options.leaseMs,
        ttlMs: options.ttlMs ?? options.leaseMs * 5,
        phase: existing?.run.phase ?? 'rollout',
      };
      const committed = await this.etcd
        .if(key, 'Mod', '==', existing?.revision ?? '0')
        .then(
          this.etcd.put(key).value(JSON.stringify(record)),
          this.leasePut(project, options.name, await this.freshLease(record.leaseMs)),
        )
        .commit();
      if (committed.succeeded) return;
    }
  }

  /** Moves the run's lease key onto a fresh etcd lease of the run's length. */
  async renew(project: string, name: string): Promise<void> {
    const existing = await this.require(project, name);
    const committed = await this.etcd
      .if(recordKey(project, name), 'Create', '>', 0)
      .then(this.leasePut(project, name, await this.freshLease(existing.run.leaseMs)))
      .commit();
    if (!committed.succeeded) throw notFound(name);
  }

  /** An etcd lease of the run's length, not kept alive here: the next renewal replaces it. */
  private async freshLease(leaseMs: number): Promise<string> {
    const lease = this.etcd.lease(leaseSeconds(leaseMs), { autoKeepAlive: false });
    const leaseId = await lease.grant();
    lease.release();
    return leaseId;
  }

  private leasePut(project: string, name: string, leaseId: string) {
    return this.etcd.put(leaseKey(project, name)).value(String(Date.now())).lease(leaseId);
  }

  async setPhase(project: string, name: string, phase: TrainingPhase): Promise<void> {
    for (;;) {
      const existing = await this.require(project, name);
      const committed = await this.etcd
        .if(recordKey(project, name), 'Mod', '==', existing.revision)
        .then(this.etcd.put(recordKey(project, name)).value(JSON.stringify({ ...existing.run, phase })))
        .commit();
      if (committed.succeeded) return;
    }
  }

  async end(project: string, name: string): Promise<void> {
    await this.etcd
      .if(recordKey(project, name), 'Create', '>', 0)
      .then(this.etcd.delete().key(recordKey(project, name)), this.etcd.delete().key(leaseKey(project, name)))
      .commit();
  }

  /**
   * Forgets a run whose grace ran out, unless a trainer renewed it meanwhile: a node whose
   * grace ended cannot delete a run another replica just brought back.
   */
  async expire(project: string, name: string): Promise<void> {
    await this.etcd
      .if(leaseKey(project, name), 'Create', '==', 0)
      .then(this.etcd.delete().key(recordKey(project, name)))
      .commit();
  }

  private async read(
    project: string,
    name: string,
  ): Promise<{ run: SharedRun; revision: string } | undefined> {
    const response = await this.etcd.get(recordKey(project, name)).exec();
    const kv = response.kvs[0];
    if (!kv) return undefined;
    return { run: sharedRunSchema.parse(JSON.parse(kv.value.toString())), revision: kv.mod_revision };
  }

  private async require(project: string, name: string): Promise<{ run: SharedRun; revision: string }> {
    const existing = await this.read(project, name);
    if (!existing) throw notFound(name);
    return existing;
  }
}

function notFound(name: string): SandgymError {
  return new SandgymError('not_found', `No run "${name}": start it with platform.startRun()`);
}

/**
 * Keeps a node's runs in line with etcd: runs started while it was away or unreachable, phases it
 * missed, lapses (etcd deleting a lease key) and ends. Its own lease clock is off from then on.
 */
export async function followSharedRuns(
  etcd: Etcd3,
  runs: RunManager,
  logger: Logger,
): Promise<{ close(): Promise<void> }> {
  const ledger = new RunLedger(etcd);
  runs.useSharedLeases((project, name) => ledger.expire(project, name));
  const records = new Map<string, SharedRun>();
  const alive = new Set<string>();
  const id = (project: string, name: string): string => `${project}/${name}`;
  // changes are applied one at a time, in etcd's order
  let applying: Promise<void> = Promise.resolve();
  const apply = (work: () => Promise<void>): void => {
    applying = applying
      .then(work)
      .catch((error: unknown) => logger.warn({ err: error }, 'applying a run change from etcd failed'));
  };
  const sync = (project: string, name: string): Promise<void> => {
    const record = records.get(id(project, name));
    return record
      ? runs.follow(project, record, alive.has(id(project, name)))
      : runs.endIfKnown(project, name);
  };
  const take = (kv: IKeyValue, deleted: boolean): { project: string; name: string } | undefined => {
    const parsed = parseKey(kv.key.toString());
    if (!parsed) return undefined;
    const runId = id(parsed.project, parsed.name);
    if (parsed.part === 'lease') {
      if (deleted) alive.delete(runId);
      else alive.add(runId);
    } else if (deleted) {
      records.delete(runId);
    } else {
      const record = sharedRunSchema.safeParse(JSON.parse(kv.value.toString()));
      if (!record.success) {
        logger.warn({ run: runId }, 'ignoring a malformed run record in etcd');
        return undefined;
      }
      records.set(runId, record.data);
    }
    return parsed;
  };

  const current = await etcd.getAll().prefix(RUNS_PREFIX).exec();
  for (const kv of current.kvs) take(kv, false);
  const seen = new Set([...records.keys()]);
  for (const runId of seen) {
    const [project, name] = runId.split('/') as [string, string];
    apply(() => sync(project, name));
  }
  // a run this node knows that etcd no longer has was ended while the node was away
  for (const { project, name } of runs.known())
    if (!seen.has(id(project, name))) apply(() => runs.endIfKnown(project, name));

  const watcher: Watcher = await etcd
    .watch()
    .prefix(RUNS_PREFIX)
    .startRevision(String(BigInt(current.header.revision) + 1n))
    .create();
  const changed = (kv: IKeyValue, deleted: boolean): void => {
    const run = take(kv, deleted);
    if (run) apply(() => sync(run.project, run.name));
  };
  watcher.on('put', (kv) => changed(kv, false));
  watcher.on('delete', (kv) => changed(kv, true));
  return {
    close: async () => {
      await watcher.cancel();
      await applying;
    },
  };
}
