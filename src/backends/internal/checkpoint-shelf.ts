import { SandgymError } from '../../common/index.ts';
import { MAX_CHECKPOINTS_PER_SANDBOX, type SandboxCheckpoint } from '../contract.ts';

/**
 * The checkpoints one sandbox keeps, by id, each with what its backend made (a VM snapshot, a
 * CRIU image and a copy of the writable layer). Past {@link MAX_CHECKPOINTS_PER_SANDBOX} the
 * oldest is deleted: each holds memory and writes outside the sandbox's disk cap.
 */
export class CheckpointShelf<T> {
  private readonly kept = new Map<string, T>();

  constructor(
    private readonly sandboxId: string,
    private readonly drop: (made: T) => Promise<void>,
  ) {}

  async add(id: string, made: T): Promise<void> {
    this.kept.set(id, made);
    const [oldest] = this.kept.entries();
    if (this.kept.size > MAX_CHECKPOINTS_PER_SANDBOX && oldest) {
      this.kept.delete(oldest[0]);
      await this.drop(oldest[1]);
    }
  }

  /** One of them; `not_found`, saying how long checkpoints live, for any other. */
  get(checkpoint: SandboxCheckpoint | string): T {
    const id = typeof checkpoint === 'string' ? checkpoint : checkpoint.id;
    const made = this.kept.get(id);
    if (made === undefined)
      throw new SandgymError(
        'not_found',
        `Sandbox ${this.sandboxId} has no checkpoint "${id}": a checkpoint lives as long as the sandbox that made it`,
      );
    return made;
  }
}

/**
 * The live sandbox `sourceId` of a backend and its checkpoint `checkpointId`: what a fork from it
 * starts from. Only the source's own shelf is looked at, so the id of another sandbox's
 * checkpoint (another project's) is as missing here as one never made.
 */
export function checkpointOf<S extends { id: string; checkpoints: Pick<CheckpointShelf<unknown>, 'get'> }>(
  sandboxes: readonly S[],
  sourceId: string,
  checkpointId: string,
  backend: string,
): { source: S; checkpoint: ReturnType<S['checkpoints']['get']> } {
  const source = sandboxes.find((sandbox) => sandbox.id === sourceId);
  if (!source) throw new SandgymError('not_found', `No live ${backend} "${sourceId}" of this process`);
  return { source, checkpoint: source.checkpoints.get(checkpointId) as ReturnType<S['checkpoints']['get']> };
}
