import { describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { MemoryAdmission } from '../../src/platform/node/memory-admission.ts';

function refusal(check: () => void): { code: string; retryable: boolean; message: string } | undefined {
  try {
    check();
    return undefined;
  } catch (error) {
    if (!isSandgymError(error)) throw error;
    return { code: error.code, retryable: error.retryable, message: error.message };
  }
}

describe('memory admission by measured use', () => {
  const policy = { capacityMib: 256, overcommit: 2, freeFloorMib: 256, headroom: 0.25 };

  it('refuses for good what can never fit, and for now what does not fit yet', () => {
    const memory = new MemoryAdmission(policy, () => 10_000);
    expect(refusal(() => memory.check('n1', 300))).toMatchObject({
      code: 'admission_rejected',
      retryable: false,
      message: expect.stringMatching(/can never fit node n1 \(256 MiB\); ask for less memory/) as unknown,
    });
    // unmeasured sandboxes are charged in full: 4 x 128 MiB fill the 512 MiB an overcommit of 2 allows
    for (let i = 0; i < 4; i++) {
      expect(refusal(() => memory.check('n1', 128))).toBeUndefined();
      memory.admit(`s${i}`, 128);
    }
    expect(refusal(() => memory.check('n1', 128))).toMatchObject({
      code: 'admission_rejected',
      retryable: true,
    });
  });

  it('charges measured use plus headroom, so idle sandboxes that asked for much leave room', () => {
    const memory = new MemoryAdmission(policy, () => 10_000);
    for (let i = 0; i < 4; i++) memory.admit(`s${i}`, 128);
    for (let i = 0; i < 4; i++) memory.measured(`s${i}`, 10);
    expect(memory.chargedMib).toBe(4 * (10 + 32));
    expect(refusal(() => memory.check('n1', 128))).toBeUndefined();
    // a sandbox is never charged more than it asked for
    memory.measured('s0', 500);
    expect(memory.chargedMib).toBe(128 + 3 * 42);
  });

  it('keeps a floor of free host memory whatever the charges say', () => {
    const memory = new MemoryAdmission(policy, () => 300);
    expect(refusal(() => memory.check('n1', 64))).toMatchObject({
      code: 'admission_rejected',
      retryable: true,
      message: expect.stringMatching(/short of free memory \(it keeps at least 256 MiB free\)/) as unknown,
    });
  });
});
