import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

/** A named counter from /proc/<pid>/net/snmp ("Ip:" header line, then a values line). */
function snmpCounter(text: string, table: string, name: string): number {
  const [header, values] = text.split('\n').filter((line) => line.startsWith(`${table}:`));
  const index = header?.split(/\s+/).indexOf(name) ?? -1;
  return index > 0 ? Number(values?.split(/\s+/)[index] ?? 0) : 0;
}

/**
 * Outbound connections and datagrams the network namespace of `pid` had no route for: with
 * loopback only, every attempt to reach another address (a mirror, a package index, a host)
 * counts here. The kernel keeps the counter per namespace, and a process in the sandbox cannot
 * reset it. Undefined when the process is gone.
 */
export async function deniedEgressOf(pid: number): Promise<number | undefined> {
  try {
    const [v4, v6] = await Promise.all([
      readFile(`/proc/${pid}/net/snmp`, 'utf8'),
      readFile(`/proc/${pid}/net/snmp6`, 'utf8').catch(() => ''),
    ]);
    return noRoutes(v4, v6);
  } catch {
    return undefined;
  }
}

/** {@link deniedEgressOf}, read synchronously (two small proc files, for a step's signals). */
export function deniedEgressNow(pid: number): number | undefined {
  try {
    const v4 = readFileSync(`/proc/${pid}/net/snmp`, 'utf8');
    let v6 = '';
    try {
      v6 = readFileSync(`/proc/${pid}/net/snmp6`, 'utf8');
    } catch {
      // no IPv6 in the namespace
    }
    return noRoutes(v4, v6);
  } catch {
    return undefined;
  }
}

function noRoutes(v4: string, v6: string): number {
  const v6Line = v6.split('\n').find((line) => line.startsWith('Ip6OutNoRoutes'));
  return snmpCounter(v4, 'Ip', 'OutNoRoutes') + Number(v6Line?.split(/\s+/)[1] ?? 0);
}
