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

  has(id: string): boolean {
    return this.kept.has(id);
  }

  /** One of them; `not_found`, saying how long checkpoints live, for any other. */
  get(checkpoint: SandboxCheckpoint | string): T {
    const id = typeof checkpoint === 'string' ? checkpoint : checkpoint.id;
    const made = this.kept.get(id);
    if (made === undefined)
      throw new SandgymError('not_found', `Sandbox ${this.sandboxId} ${NO_CHECKPOINT(id)}`);
    return made;
  }
}

/** Why a checkpoint is not there, for a sandbox or a node. */
const NO_CHECKPOINT = (id: string): string =>
  `has no checkpoint "${id}": a checkpoint lives as long as the sandbox that made it`;

/** The live sandbox of a backend that holds checkpoint `id`: what a fork from it starts from. */
export function holderOf<S extends { checkpoints: Pick<CheckpointShelf<unknown>, 'has'> }>(
  sandboxes: readonly S[],
  id: string,
  backend: string,
): S {
  const holder = sandboxes.find((sandbox) => sandbox.checkpoints.has(id));
  if (!holder) throw new SandgymError('not_found', `No ${backend} of this node ${NO_CHECKPOINT(id)}`);
  return holder;
}
