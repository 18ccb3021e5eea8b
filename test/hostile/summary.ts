import { appendFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { TEST_DATA_ROOT } from '../support/platform.ts';

/** Where every hostile test file records its attacks, for the totals printed at the end. */
const SUMMARY_FILE = join(TEST_DATA_ROOT, 'hostile-summary.jsonl');

/** One attack and whether it was contained: what a failing test did not get to record counts as not. */
interface AttackRecord {
  kind: string;
  name: string;
  contained: boolean;
}

/** Records an attack; call it where the test knows the outcome (contained only after its checks pass). */
export function recordAttack(kind: string, name: string, contained: boolean): void {
  appendFileSync(SUMMARY_FILE, `${JSON.stringify({ kind, name, contained } satisfies AttackRecord)}\n`);
}

/**
 * Runs `check`, the test of one attack, and records it: contained when the check passed, not
 * contained when it threw (the test then fails with the check's own error).
 */
export async function attack(kind: string, name: string, check: () => Promise<void>): Promise<void> {
  try {
    await check();
  } catch (error) {
    recordAttack(kind, name, false);
    throw error;
  }
  recordAttack(kind, name, true);
}

/** Vitest global setup: a fresh record at the start, the totals across every file at the end. */
export function setup(): () => void {
  rmSync(SUMMARY_FILE, { force: true });
  return () => {
    if (!existsSync(SUMMARY_FILE)) return;
    const records = readFileSync(SUMMARY_FILE, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as AttackRecord);
    const kinds = [...new Set(records.map((r) => r.kind))].sort();
    const byKind = kinds
      .map((kind) => {
        const mine = records.filter((r) => r.kind === kind);
        return `${kind} ${mine.filter((r) => r.contained).length}/${mine.length}`;
      })
      .join(', ');
    const contained = records.filter((r) => r.contained).length;
    console.log(`hostile suite total: ${records.length} attacks run, ${contained} contained (${byKind})`);
  };
}
