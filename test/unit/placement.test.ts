import { describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { Placer, type NodeLoad } from '../../src/platform/index.ts';
import { FairQueue } from '../../src/platform/controller/fair-queue.ts';

function nodes(count: number, capacity = 1_000): NodeLoad[] {
  return Array.from({ length: count }, (_, i) => ({
    nodeId: `n${i}`,
    healthy: true,
    backends: ['container'],
    sandboxes: 0,
    capacity,
    memoryCommittedMib: 0,
    memoryCapacityMib: 1 << 20,
  }));
}

const DEMAND = { backend: 'container' as const, memoryMib: 64 };

describe('Placer', () => {
  it('spreads a burst evenly over a stale view thanks to its in-flight overlay', () => {
    const view = nodes(160);
    const placer = new Placer(2);
    const counts = new Map<string, number>();
    for (let i = 0; i < 32_000; i++) {
      const node = placer.choose(view, DEMAND);
      expect(node).toBeDefined();
      placer.reserve(node!.nodeId, DEMAND);
      counts.set(node!.nodeId, (counts.get(node!.nodeId) ?? 0) + 1);
    }
    const loads = [...counts.values()];
    const mean = 32_000 / 160;
    expect(Math.max(...loads) / mean).toBeLessThanOrEqual(1.1);
  });

  it('skips unhealthy, unfit and vetoing nodes, and finds the last one with room', () => {
    const view = nodes(50, 1);
    for (const node of view) node.sandboxes = 1; // all full ...
    view[7]!.sandboxes = 0; // ... but one
    view[3]!.healthy = false;
    view[3]!.sandboxes = 0;
    const placer = new Placer(2, () => 0.5);
    expect(placer.choose(view, DEMAND)?.nodeId).toBe('n7');
    expect(placer.choose(view, DEMAND, new Set(['n7']))).toBeUndefined();
    expect(placer.choose(view, { backend: 'vm', memoryMib: 64 })).toBeUndefined();
    const release = placer.reserve('n7', DEMAND);
    expect(placer.choose(view, DEMAND)).toBeUndefined(); // its own placement fills it
    release();
    expect(placer.choose(view, DEMAND)?.nodeId).toBe('n7');
  });
});

describe('FairQueue', () => {
  it('wakes projects in turn, so a flood from one does not starve another', async () => {
    const queue = new FairQueue();
    const order: string[] = [];
    const deadline = Date.now() + 10_000;
    const waits = [
      ...['a1', 'a2', 'a3', 'a4'].map((name) => queue.wait('a', deadline).then(() => order.push(name))),
      ...['b1', 'b2'].map((name) => queue.wait('b', deadline).then(() => order.push(name))),
    ];
    expect(queue.size).toBe(6);
    queue.wake(3);
    await new Promise((resolve) => setTimeout(resolve, 0));
    expect(order).toEqual(['a1', 'b1', 'a2']);
    queue.wake();
    await Promise.all(waits);
    expect(order).toEqual(['a1', 'b1', 'a2', 'b2', 'a3', 'a4']);
  });

  it('fails a wait at its deadline or on abort, with a message saying what to change', async () => {
    const queue = new FairQueue();
    const late = await queue.wait('a', Date.now() + 20).catch((e: unknown) => e);
    expect(isSandgymError(late, 'resource_exhausted')).toBe(true);
    expect(String(late)).toMatch(/fewer or smaller sandboxes|longer deadline/);
    const controller = new AbortController();
    const waiting = queue.wait('a', Date.now() + 10_000, controller.signal).catch((e: unknown) => e);
    controller.abort();
    expect(isSandgymError(await waiting, 'cancelled')).toBe(true);
    expect(queue.size).toBe(0);
  });
});
