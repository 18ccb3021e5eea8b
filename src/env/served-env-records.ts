import { mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { writeFileAtomic } from '../common/index.ts';
import { chatOptions, envSpecSchema } from '../platform/index.ts';

const ENV_ID = /^env-[a-z0-9]{1,32}-[a-z0-9]{12}$/;

/**
 * What a node keeps of a served env on its disk, so its successor on the same data dir carries
 * the env on: who owns it, what it was made as, the limits its Make came with, and the episode
 * its sandbox (adopted by the successor) is in. Its steps are in the sandbox's trajectory log.
 * Read back from disk, so validated like any input.
 */
const servedEnvRecord = z.strictObject({
  envId: z.string().regex(ENV_ID),
  project: z.string().min(1).max(64),
  spec: envSpecSchema,
  limits: z.strictObject({
    quota: z.number().int().nonnegative().optional(),
    network: z.array(z.string().max(256)).max(1024).optional(),
  }),
  episode: z
    .strictObject({
      sandboxId: z.string().min(1).max(128),
      episodeId: z.string().min(1).max(512),
      /** A task env's agent deadline, in ms since the epoch. */
      deadlineAt: z.number().optional(),
    })
    .optional(),
  /**
   * The chat episode the env is in, as of its last turn: its options, the turns and tokens spent,
   * whether it ended, the step index its next turn starts at (a turn the crash cut reruns from
   * there, its logged steps answered from the log), and the last turn's answer and result, for a
   * retry whose answer the crash lost.
   */
  chat: z
    .strictObject({
      options: chatOptions,
      turns: z.number().int().nonnegative(),
      tokens: z.number().int().nonnegative(),
      ended: z.boolean(),
      stepsBefore: z.number().int().nonnegative(),
      last: z
        .strictObject({
          turn: z.number().int().nonnegative(),
          answer: z.unknown(),
          result: z.record(z.string(), z.unknown()),
        })
        .optional(),
    })
    .optional(),
});
export type ServedEnvRecord = z.output<typeof servedEnvRecord>;

/** The served envs' records of one node: a file per env, replaced whole (never half written). */
export class ServedEnvRecords {
  constructor(private readonly dir: string) {}

  /** Every env the node served when it stopped; a record that does not read back is skipped. */
  async list(): Promise<ServedEnvRecord[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const records: ServedEnvRecord[] = [];
    for (const name of names) {
      if (!name.endsWith('.json')) continue;
      const text = await readFile(join(this.dir, name), 'utf8').catch(() => undefined);
      const parsed = servedEnvRecord.safeParse(parseJson(text));
      if (parsed.success && `${parsed.data.envId}.json` === name) records.push(parsed.data);
    }
    return records;
  }

  async write(record: ServedEnvRecord): Promise<void> {
    const checked = servedEnvRecord.parse(record);
    await mkdir(this.dir, { recursive: true });
    await writeFileAtomic(join(this.dir, `${checked.envId}.json`), JSON.stringify(checked));
  }

  async remove(envId: string): Promise<void> {
    if (ENV_ID.test(envId)) await rm(join(this.dir, `${envId}.json`), { force: true });
  }
}

function parseJson(text: string | undefined): unknown {
  try {
    return text === undefined ? undefined : JSON.parse(text);
  } catch {
    return undefined;
  }
}
