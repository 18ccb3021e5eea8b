import { hostAvailableMib } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';

/** How a node promises memory. */
export interface MemoryPolicy {
  /** Physical memory the node gives sandboxes, in MiB. */
  capacityMib: number;
  /** How far the sum of charges may exceed the capacity (1 = no overcommit). */
  overcommit: number;
  /** Host memory (MemAvailable) that must stay free, in MiB, whatever the charges say. */
  freeFloorMib: number;
  /** Room above its measured use that each sandbox is charged, as a fraction of what it asked for. */
  headroom: number;
}

interface Charge {
  requestedMib: number;
  /** Last measured use; undefined until measured (then the full request is charged). */
  measuredMib: number | undefined;
}

/**
 * Admission by measured use: each sandbox is charged what it uses plus headroom (never more than
 * it asked for), so idle sandboxes that asked for a lot do not block new ones, up to the
 * overcommit ratio; and the host's free memory never drops below a floor.
 */
export class MemoryAdmission {
  private readonly charges = new Map<string, Charge>();

  constructor(
    readonly policy: MemoryPolicy,
    private readonly availableMib: () => number = hostAvailableMib,
  ) {}

  private chargeOf({ requestedMib, measuredMib }: Charge): number {
    if (measuredMib === undefined) return requestedMib;
    return Math.min(requestedMib, measuredMib + this.policy.headroom * requestedMib);
  }

  /** What the node's sandboxes are charged now, in MiB. */
  get chargedMib(): number {
    let total = 0;
    for (const charge of this.charges.values()) total += this.chargeOf(charge);
    return Math.ceil(total);
  }

  /** What the node's sandboxes asked for, in MiB: what it has committed to. */
  get requestedMib(): number {
    let total = 0;
    for (const charge of this.charges.values()) total += charge.requestedMib;
    return total;
  }

  /** What the node's sandboxes were last measured to use, in MiB (unmeasured ones count 0). */
  get measuredMib(): number {
    let total = 0;
    for (const charge of this.charges.values()) total += charge.measuredMib ?? 0;
    return total;
  }

  /** Throws a clear error unless a sandbox asking for `requestedMib` may start now. */
  check(nodeId: string, requestedMib: number): void {
    const { capacityMib, overcommit, freeFloorMib } = this.policy;
    if (requestedMib > capacityMib) {
      // not retryable: no amount of waiting makes this node big enough
      throw new SandgymError(
        'admission_rejected',
        `A sandbox of ${requestedMib} MiB can never fit node ${nodeId} (${capacityMib} MiB); ask for less memory`,
      );
    }
    const limit = capacityMib * overcommit;
    if (this.chargedMib + requestedMib > limit) {
      throw new SandgymError(
        'admission_rejected',
        // no figures: the node is shared, and what it promised is every tenant's use together
        `Node ${nodeId} has no memory left to promise ${requestedMib} MiB (measured use plus headroom, ${overcommit}x overcommit); try again or ask for less`,
        { retryable: true },
      );
    }
    const available = this.availableMib();
    if (available - Math.min(requestedMib, 64) < freeFloorMib) {
      throw new SandgymError(
        'admission_rejected',
        `Node ${nodeId} is short of free memory (it keeps at least ${freeFloorMib} MiB free); try again later`,
        { retryable: true },
      );
    }
  }

  /** Charges a sandbox (or a create in flight) its full request until it is measured. */
  admit(key: string, requestedMib: number): void {
    this.charges.set(key, { requestedMib, measuredMib: undefined });
  }

  /** Records what a sandbox uses now. */
  measured(key: string, usedMib: number): void {
    const charge = this.charges.get(key);
    if (charge) charge.measuredMib = usedMib;
  }

  release(key: string): void {
    this.charges.delete(key);
  }
}
