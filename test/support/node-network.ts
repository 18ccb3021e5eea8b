import { execFileSync } from 'node:child_process';
import type { Sandbox } from '../../src/platform/index.ts';

/** The sandbox's address on the node network, or '' when it has no veth. */
export async function addressOf(sandbox: Sandbox): Promise<string> {
  const shown = await sandbox.exec(['sh', '-c', 'ip -o -4 addr show dev eth0 2>/dev/null || true']);
  return /inet (\d+\.\d+\.\d+\.\d+)/.exec(shown.stdout)?.[1] ?? '';
}

/** The flows the host's conntrack table holds to or from `address`. */
export function flowsOf(address: string): string {
  const list = (way: string): string => {
    try {
      return execFileSync('conntrack', ['-L', way, address], { encoding: 'utf8', stdio: 'pipe' });
    } catch {
      return '';
    }
  };
  return `${list('-s')}${list('-d')}`.trim();
}
