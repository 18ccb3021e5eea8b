import { randomBytes } from 'node:crypto';
import { realpath } from 'node:fs/promises';
import { isAbsolute, resolve, sep } from 'node:path';
import { SandgymError, climbsOut, nodeScopedId } from '../common/index.ts';
import {
  ENVS,
  networkGrantOf,
  quotaOf,
  register,
  sameValue,
  stepActionOf,
  type ChatOptions,
  type EnvSpec,
  type Handlers,
  type SandboxAction,
  type StepAction,
  type HostPlatform,
  type ProjectLimits,
  type ServedService,
} from '../platform/index.ts';
import type { ResetInfo, StepInfo, StepResult } from './environment.ts';
import { ChatEnv, type ChatMessage, type ChatProgress } from './chat/chat-env.ts';
import { SandboxEnv, type CheckpointRef } from './sandbox-env.ts';
import { TaskEnv, type TaskCheckpoint } from './task-env.ts';
import { loadTasks } from './tasks/load-tasks.ts';
import { ServedEnvRecords, type ServedEnvRecord } from './served-env-records.ts';

/** Options for {@link envService}. */
export interface EnvServiceOptions {
  /** The node's id: env ids name it, so a router can find the env's node. */
  nodeId: string;
  /** Where task specs' paths are found; without it, the node serves sandbox envs only. */
  taskRoot?: string;
  /** An env that gets no call for this long is closed with its sandbox. Default 30 minutes. */
  idleTtlMs?: number;
  /**
   * Where envs are recorded, so the successor of a node that crashed (on the same data dir, whose
   * node adopts the envs' sandboxes) carries them on: their next step goes on from the sandbox's
   * trajectory log. Without it, envs end with the process.
   */
  stateDir?: string;
}

type AnyEnv = SandboxEnv | TaskEnv;

interface Served {
  project: string;
  kind: EnvSpec['kind'];
  /** What the env was made as, and with which limits: what a successor rebuilds it from. */
  made: Pick<ServedEnvRecord, 'spec' | 'limits'>;
  env: AnyEnv;
  client: HostPlatform;
  lastUsed: number;
  /** The index the next step must have. */
  next: number;
  /**
   * The last step, its action as read and its result: a retry of its index with the same action
   * (its answer was lost) gets it again; another action at that index is a divergence.
   */
  last?: { index: number; action: StepAction; result: StepResult<unknown> };
  /** Calls on one env run one at a time, in order. */
  queue: Promise<unknown>;
  /** The chat episode, once ChatReset started one: its turns go through ChatStep only. */
  chat?: ServedChat;
  /** Where the episode is, as recorded for a successor (see remember). */
  episode?: ServedEnvRecord['episode'];
}

interface ServedChat {
  env: ChatEnv;
  /** As ChatReset gave them: what a checkpoint of the episode keeps, for its forks. */
  options: ChatOptions;
  /** The index the next turn must have. */
  next: number;
  /** The last turn, its answer and result, for a retry whose answer was lost. */
  last?: { turn: number; answer: unknown; result: StepResult<ChatMessage[]> };
  /** The inner env's step index the next turn starts at. */
  stepsBefore: number;
}

/** A served env as made (or rebuilt) for its project, its next step `next`. */
function servedEnv(
  made: Pick<Served, 'project'> & Served['made'],
  env: AnyEnv,
  client: HostPlatform,
  next: number,
): Served {
  const { project, spec, limits } = made;
  return {
    project,
    kind: spec.kind,
    made: { spec, limits },
    env,
    client,
    lastUsed: Date.now(),
    next,
    queue: Promise.resolve(),
  };
}

interface Saved {
  project: string;
  kind: EnvSpec['kind'];
  checkpoint: CheckpointRef | TaskCheckpoint;
  /** Set when it was made in a chat episode: how that episode talked, and how far it got. */
  chat?: { options: ChatOptions; progress: ChatProgress; ended: boolean };
}

/** Checkpoints kept per project; past it, the project's oldest go (never another project's). */
const MAX_CHECKPOINTS_PER_PROJECT = 1024;
/** Envs a project may hold open on a node at once. */
const MAX_ENVS_PER_PROJECT = 1024;
const DEFAULT_IDLE_TTL_MS = 30 * 60_000;

/**
 * The Envs service: gym environments that live on the node, for clients in any language. Each
 * env belongs to the project that made it and runs its sandboxes through that project's client
 * of the node (admission, quotas and ownership as for direct calls). A task env builds, runs and
 * grades on the node. Checkpoints stay on the node and are restored by id.
 */
export function envService(
  clientFor: (project: string, limits: ProjectLimits) => HostPlatform,
  options: EnvServiceOptions,
): ServedService {
  const envs = new Map<string, Served>();
  const saved = new Map<string, Saved>();
  const idleTtlMs = options.idleTtlMs ?? DEFAULT_IDLE_TTL_MS;
  const records = options.stateDir ? new ServedEnvRecords(options.stateDir) : undefined;
  /** Envs a predecessor on this data dir served, rebuilt at their first call (see revive). */
  const dormant = new Map<string, { record: ServedEnvRecord; since: number }>();
  const reviving = new Map<string, Promise<Served>>();
  const loaded = (records?.list() ?? Promise.resolve([])).then((list) => {
    for (const record of list) dormant.set(record.envId, { record, since: Date.now() });
  });

  const closeEnv = async (envId: string): Promise<void> => {
    const served = envs.get(envId);
    if (!served) return;
    envs.delete(envId);
    await records?.remove(envId).catch(() => undefined);
    await served.env.close().catch(() => undefined);
    await served.client.close().catch(() => undefined);
  };
  /** A predecessor's env nobody came back for: its sandbox goes, and its record. */
  const closeDormant = async (envId: string): Promise<void> => {
    const found = dormant.get(envId);
    if (!found) return;
    dormant.delete(envId);
    const { project, limits, episode } = found.record;
    if (episode)
      await clientFor(project, limits)
        .killSandbox(episode.sandboxId)
        .catch(() => undefined);
    await records?.remove(envId).catch(() => undefined);
  };
  const reaper = setInterval(
    () => {
      const now = Date.now();
      for (const [envId, served] of envs) if (now - served.lastUsed > idleTtlMs) void closeEnv(envId);
      for (const [envId, { since }] of dormant) if (now - since > idleTtlMs) void closeDormant(envId);
    },
    Math.min(idleTtlMs, 60_000),
  );
  reaper.unref();

  /** The caller's env, live or left by a predecessor; another project's is as missing as one never made. */
  const envOf = async (envId: string, project: string): Promise<Served | ServedEnvRecord> => {
    await loaded;
    const found = envs.get(envId) ?? dormant.get(envId)?.record;
    if (found?.project !== project)
      throw new SandgymError('not_found', `No env ${envId} on node ${options.nodeId}`);
    return found;
  };

  /**
   * A predecessor's env, rebuilt over its adopted sandbox: its episode goes on at `stepIndex`
   * (a step's retry, whose record the trajectory log holds) or at the log's tail, and the
   * platform's log answers for every step already run, so none runs twice.
   */
  const revive = (envId: string, project: string, stepIndex: number | undefined): Promise<Served> => {
    let pending = reviving.get(envId);
    if (!pending) {
      pending = (async () => {
        const found = await envOf(envId, project);
        if (!('envId' in found)) return found;
        const served = await rebuild(found, stepIndex);
        dormant.delete(envId);
        envs.set(envId, served);
        return served;
      })().finally(() => reviving.delete(envId));
      reviving.set(envId, pending);
    }
    return pending;
  };

  const rebuild = async (record: ServedEnvRecord, asked: number | undefined): Promise<Served> => {
    const { project, spec, limits, episode } = record;
    // a chat turn the crash cut reruns from its first step, whose logged steps the log answers
    const stepIndex = asked ?? record.chat?.stepsBefore;
    const client = clientFor(project, limits);
    let env = await make(spec, client);
    let next = 0;
    const sandbox = episode && (await client.attachSandbox(episode.sandboxId).catch(() => undefined));
    // a sandbox that did not outlive the node (it ended, or was reaped): the env waits for a reset
    if (episode && sandbox) {
      const logged = await loggedSteps(client, sandbox.id, episode.episodeId);
      // an index past the log is refused as out of order by the Step handler, and the env lives on
      next = Math.min(stepIndex ?? logged, logged);
      if (env instanceof TaskEnv) {
        const budgetLeftMs = Math.max(0, (episode.deadlineAt ?? Date.now()) - Date.now());
        await env.attach(sandbox, episode.episodeId, budgetLeftMs, { nextStepIndex: next });
      } else if (spec.kind === 'sandbox') {
        env = await SandboxEnv.attach(client, sandbox, episode.episodeId, {
          ...sandboxOptions(spec),
          owned: true,
          nextStepIndex: next,
        });
      }
    }
    const served = servedEnv(record, env, client, next);
    if (episode && sandbox) served.episode = episode;
    if (episode && sandbox && record.chat) {
      const { options: chat, turns, tokens, ended, stepsBefore, last } = record.chat;
      const chatEnv = chatEnvOf(env, chat);
      chatEnv.continueEpisode(episode.episodeId, { turns, tokens }, ended);
      served.chat = {
        env: chatEnv,
        options: chat,
        next: turns,
        stepsBefore,
        // the node's own record, validated as it was read: the result is as this node returned it
        ...(last ? { last: { ...last, result: last.result as unknown as StepResult<ChatMessage[]> } } : {}),
      };
    }
    return served;
  };

  /**
   * Records where an env's episode is (a new one when `reset` is given) and its chat episode's
   * progress, for a successor; a node without a state dir keeps nothing.
   */
  const remember = async (envId: string, served: Served, reset?: { info: ResetInfo }): Promise<void> => {
    if (reset)
      served.episode = {
        sandboxId: reset.info.sandboxId,
        episodeId: reset.info.episodeId,
        ...(served.env instanceof TaskEnv ? { deadlineAt: Date.now() + served.env.budgetLeftMs } : {}),
      };
    if (!records) return;
    const { episode, chat } = served;
    await records.write({
      envId,
      project: served.project,
      ...served.made,
      ...(episode ? { episode } : {}),
      ...(chat ? { chat: chatRecord(chat) } : {}),
    });
  };
  /** The caller's env checkpoint; another project's is as missing as one never made. */
  const checkpointOf = (checkpointId: string, project: string): Saved => {
    const found = saved.get(checkpointId);
    if (found?.project !== project)
      throw new SandgymError('not_found', `No checkpoint ${checkpointId} on node ${options.nodeId}`);
    return found;
  };

  /**
   * The caller's env, with `work` queued behind its other calls; a predecessor's is rebuilt
   * first (at `stepIndex`, for a step).
   */
  const withEnv = async <T>(
    envId: string,
    project: string,
    work: (served: Served) => Promise<T>,
    stepIndex?: number,
  ): Promise<T> => {
    await loaded;
    const served = envs.get(envId) ?? (await revive(envId, project, stepIndex));
    if (served.project !== project)
      throw new SandgymError('not_found', `No env ${envId} on node ${options.nodeId}`);
    served.lastUsed = Date.now();
    const result = served.queue.then(() => work(served));
    served.queue = result.catch(() => undefined);
    return result;
  };

  const make = async (spec: EnvSpec, client: HostPlatform): Promise<AnyEnv> => {
    if (spec.kind === 'sandbox') return SandboxEnv.create(client, sandboxOptions(spec));
    const task = await taskOf(spec, options.taskRoot);
    return TaskEnv.create(client, task);
  };

  /**
   * Takes a served env back to a checkpoint of its project: a new episode, its step index 0. A
   * memory checkpoint restores only in the sandbox that made it (the env says so).
   */
  const restoreServed = async (served: Served, found: Saved, episodeId?: string) => {
    if (found.kind !== served.kind)
      throw new SandgymError('not_found', `No checkpoint of a ${served.kind} env on node ${options.nodeId}`);
    const branch = episodeId ? { episodeId } : {};
    const restored =
      served.env instanceof TaskEnv
        ? await served.env.restore(found.checkpoint as TaskCheckpoint, branch)
        : await served.env.restore(found.checkpoint, branch);
    served.next = 0;
    delete served.last;
    return restored;
  };

  const handlers: Handlers<typeof ENVS> = {
    // `beside` is for placement (a controller's); the resolver has checked it is the caller's env here
    Make: async ({ spec }, call) => {
      const project = call.principal.project;
      await loaded;
      const held = [...envs.values(), ...[...dormant.values()].map((entry) => entry.record)].filter(
        (served) => served.project === project,
      ).length;
      if (held >= MAX_ENVS_PER_PROJECT)
        throw new SandgymError(
          'resource_exhausted',
          `Project ${project} holds ${held} envs on node ${options.nodeId}, the most it may: Close the ones it is done with`,
        );
      // a controller's call carries the project's network grant and quota: its env keeps to them
      const quota = quotaOf(call.metadata);
      const network = networkGrantOf(call.metadata);
      const limits = {
        ...(quota === undefined ? {} : { quota }),
        ...(network ? { network: [...network] } : {}),
      };
      const client = clientFor(project, limits);
      const env = await make(spec, client).catch(async (error: unknown) => {
        await client.close();
        throw error;
      });
      const envId = nodeScopedId('env', options.nodeId);
      const served = servedEnv({ project, spec, limits }, env, client, 0);
      envs.set(envId, served);
      await remember(envId, served).catch(async (error: unknown) => {
        await closeEnv(envId);
        throw error;
      });
      return { envId, kind: spec.kind };
    },
    Reset: ({ envId, seed, options: resetOptions }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const reset = await served.env.reset({
          ...(seed === undefined ? {} : { seed }),
          ...(resetOptions?.episodeId ? { options: { episodeId: resetOptions.episodeId } } : {}),
        });
        served.next = 0;
        delete served.last;
        delete served.chat;
        await remember(envId, served, reset);
        return wireReset(reset);
      }),
    Step: ({ envId, stepIndex, action }, call) =>
      withEnv(
        envId,
        call.principal.project,
        async (served) => {
          if (served.chat)
            throw new SandgymError(
              'failed_precondition',
              `Env ${envId} is in a chat episode: step it with ChatStep, or Reset it`,
            );
          // read as the step reads it, so a retry matches whatever form the action came in
          const read = stepActionOf(action);
          if (served.last && stepIndex === served.last.index) {
            if (!sameValue(served.last.action, read))
              throw new SandgymError(
                'divergence',
                `Step ${stepIndex} of env ${envId} already ran another action: ${JSON.stringify(served.last.action).slice(0, 1024)}`,
              );
            return wireStep({ ...served.last.result, info: { ...served.last.result.info, replayed: true } });
          }
          if (stepIndex !== served.next) {
            throw new SandgymError(
              'invalid_argument',
              `Step ${stepIndex} of env ${envId} is out of order: the next step is ${served.next}`,
            );
          }
          // whatever it is: an invalid action is an observation of its step (see stepActionOf)
          const result = await served.env.step(read as SandboxAction);
          // a step the platform could not answer keeps its index, for the retry
          if (!(result.outcome.kind === 'infra_failure' && result.outcome.reason === 'node_lost')) {
            served.last = { index: stepIndex, action: read, result };
            served.next = stepIndex + 1;
          }
          return wireStep(result);
        },
        stepIndex,
      ),
    Checkpoint: ({ envId, depth: asked }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const checkpoint = await served.env.checkpoint(asked ? { depth: asked } : {});
        const checkpointId = `ckpt-${randomBytes(8).toString('hex')}`;
        const chat = served.chat && {
          options: served.chat.options,
          progress: served.chat.env.progress,
          ended: served.chat.env.ended,
        };
        saved.set(checkpointId, {
          project: served.project,
          kind: served.kind,
          checkpoint,
          ...(chat ? { chat } : {}),
        });
        const mine = [...saved].filter(([, entry]) => entry.project === served.project);
        if (mine.length > MAX_CHECKPOINTS_PER_PROJECT) saved.delete(mine[0]![0]);
        const { environment, episodeId, stepIndex, depth } = checkpoint;
        return { checkpointId, environment, episodeId, stepIndex, depth };
      }),
    Restore: ({ envId, checkpointId }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const restored = await restoreServed(served, checkpointOf(checkpointId, served.project));
        delete served.chat;
        await remember(envId, served, restored);
        return wireReset(restored);
      }),
    ChatRestore: ({ envId, checkpointId, options: restoreOptions }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const found = checkpointOf(checkpointId, served.project);
        if (!found.chat)
          throw new SandgymError(
            'failed_precondition',
            `Checkpoint ${checkpointId} was not made in a chat episode: Restore it, or ChatReset`,
          );
        // its budgets were spent or it was graded: a fork of it would be turns it never had
        if (found.chat.ended)
          throw new SandgymError(
            'failed_precondition',
            `Checkpoint ${checkpointId} was made after its chat episode ended: checkpoint before the last turn, or ChatReset`,
          );
        const restored = await restoreServed(served, found, restoreOptions?.episodeId);
        const env = chatEnvOf(served.env, found.chat.options);
        const resumed = env.resume(restored, found.chat.progress);
        served.chat = {
          env,
          options: found.chat.options,
          next: found.chat.progress.turns,
          stepsBefore: served.env.nextStepIndex,
        };
        await remember(envId, served, restored);
        return { messages: resumed.observation.map(plain), info: plain(resumed.info) };
      }),
    ChatReset: ({ envId, seed, options: resetOptions, chat }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const env = chatEnvOf(served.env, chat ?? {});
        const reset = await env.reset({
          ...(seed === undefined ? {} : { seed }),
          ...(resetOptions?.episodeId ? { options: { episodeId: resetOptions.episodeId } } : {}),
        });
        served.next = 0;
        delete served.last;
        served.chat = { env, options: chat ?? {}, next: 0, stepsBefore: served.env.nextStepIndex };
        await remember(envId, served, reset);
        return { messages: reset.observation.map(plain), info: plain(reset.info) };
      }),
    ChatStep: ({ envId, turn, answer, tokens }, call) =>
      withEnv(envId, call.principal.project, async (served) => {
        const chat = served.chat;
        if (!chat)
          throw new SandgymError(
            'failed_precondition',
            `Env ${envId} has no chat episode: call ChatReset first`,
          );
        if (chat.last && turn === chat.last.turn) {
          if (!sameValue(chat.last.answer, answer))
            throw new SandgymError('divergence', `Turn ${turn} of env ${envId} already ran another answer`);
          return wireChatStep({ ...chat.last.result, info: { ...chat.last.result.info, replayed: true } });
        }
        if (turn !== chat.next)
          throw new SandgymError(
            'invalid_argument',
            `Turn ${turn} of env ${envId} is out of order: the next turn is ${chat.next}`,
          );
        // whatever it holds: what cannot be read is the model's observation (see ChatEnv.step)
        const result = await chat.env.step(answer, tokens === undefined ? {} : { tokens });
        chat.last = { turn, answer, result };
        chat.next = turn + 1;
        chat.stepsBefore = served.env.nextStepIndex;
        await remember(envId, served);
        return wireChatStep(result);
      }),
    // queued like any call: a step in flight ends (and is recorded) before its env goes
    Close: ({ envId }, call) =>
      withEnv(envId, call.principal.project, async () => {
        await closeEnv(envId);
        return {};
      }),
  };
  // the ids only this service knows; sandboxes, layers, environments and runs are the node's
  const registration = register(ENVS, handlers, {
    env: (envId, { project }) => envOf(envId, project),
    envCheckpoint: (checkpointId, { project }) => checkpointOf(checkpointId, project),
  });

  return {
    registration,
    reserved() {
      const counts: Record<string, number> = {};
      const without = [
        ...[...envs.values()].filter(({ env }) => !(env instanceof TaskEnv ? env.sandbox : env.current)),
        // a predecessor's env with an episode has its sandbox among the node's adopted ones
        ...[...dormant.values()].map((entry) => entry.record).filter((record) => !record.episode),
      ];
      for (const { project } of without) counts[project] = (counts[project] ?? 0) + 1;
      return counts;
    },
    async close() {
      clearInterval(reaper);
      // a node that closes ends its sandboxes: only a crashed one leaves envs to carry on
      await Promise.all([...envs.keys()].map(closeEnv));
    },
  };
}

/** The task a spec names, found under the node's task root and nowhere else. */
async function taskOf(spec: Extract<EnvSpec, { kind: 'task' }>, taskRoot: string | undefined) {
  if (!taskRoot)
    throw new SandgymError(
      'failed_precondition',
      'This node serves no task envs: start it with `sandgym node --task-root DIR`',
    );
  if (isAbsolute(spec.path) || climbsOut(spec.path))
    throw new SandgymError(
      'invalid_argument',
      `Task path ${spec.path} must be relative to the node's task root, without a ".." component`,
    );
  const root = await realpath(taskRoot);
  // missing, or leading out through a link: one answer, so a path outside says nothing of the host
  const missing = new SandgymError('not_found', `No task at ${spec.path} under the node's task root`);
  const path = await realpath(resolve(root, spec.path)).catch(() => {
    throw missing;
  });
  if (path !== root && !path.startsWith(root + sep)) throw missing;
  const tasks = await loadTasks([path]);
  const task = spec.task ? tasks.find((t) => t.id === spec.task) : tasks.length === 1 ? tasks[0] : undefined;
  if (!task)
    throw new SandgymError(
      'not_found',
      spec.task
        ? `No task ${spec.task} at ${spec.path}; there are ${tasks.map((t) => t.id).join(', ')}`
        : `${spec.path} holds ${tasks.length} tasks (${tasks.map((t) => t.id).join(', ')}): name one in spec.task`,
    );
  return task;
}

/** How many steps of an episode a sandbox's trajectory log holds: where the episode goes on. */
async function loggedSteps(client: HostPlatform, sandboxId: string, episodeId: string): Promise<number> {
  const records = await (await client.stepLog(sandboxId)).records();
  return records.filter((record) => record.episodeId === episodeId).length;
}

/** A sandbox env's options, as its spec gives them. */
function sandboxOptions(spec: Extract<EnvSpec, { kind: 'sandbox' }>) {
  return {
    ...(spec.sandbox ? { sandbox: spec.sandbox } : {}),
    ...(spec.user ? { user: spec.user } : {}),
    ...(spec.protectedPaths ? { protectedPaths: spec.protectedPaths } : {}),
  };
}

/** A reset as the wire carries it: plain maps, nothing undefined. */
function wireReset(reset: { observation: unknown; info: ResetInfo }) {
  return { observation: plain(reset.observation), info: plain(reset.info) };
}

function wireStep(result: StepResult<unknown, StepInfo>) {
  return {
    observation: plain(result.observation),
    reward: result.reward,
    terminated: result.terminated,
    truncated: result.truncated,
    info: plain(result.info),
    outcome: plain(result.outcome),
  };
}

/** What a successor needs of a chat episode (see ServedEnvRecord's `chat`). */
function chatRecord(chat: ServedChat): NonNullable<ServedEnvRecord['chat']> {
  return {
    options: chat.options,
    ...chat.env.progress,
    ended: chat.env.ended,
    stepsBefore: chat.stepsBefore,
    ...(chat.last ? { last: { ...chat.last, result: plain(chat.last.result) } } : {}),
  };
}

/** A chat env over a served env, as a client's wire options ask for it. */
function chatEnvOf(env: AnyEnv, chat: ChatOptions): ChatEnv {
  const { format, ...rest } = chat;
  return ChatEnv.create(env, { ...rest, ...(format ? { parser: format } : {}) });
}

function wireChatStep(result: StepResult<ChatMessage[], StepInfo>) {
  const { observation, ...rest } = wireStep(result);
  return { ...rest, messages: (observation as unknown as ChatMessage[]).map(plain) };
}

/** A value as plain JSON data: what a client in another language can read. */
function plain(value: unknown): Record<string, unknown> {
  return JSON.parse(JSON.stringify(value)) as Record<string, unknown>;
}
