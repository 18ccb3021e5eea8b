import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { Platform } from '../../src/platform/index.ts';
import { openHandlesUnder } from './open-handles.ts';
import { isUpstreamServer, reapStaleUpstreams } from './upstream.ts';
import { STORE_DIR, TEST_DATA_ROOT } from './platform.ts';

mkdirSync(TEST_DATA_ROOT, { recursive: true });

/** What the suite may not leave behind: mounts, cgroups, network namespaces, links, nftables tables and processes of ours. */
function findLeaks(): string[] {
  const leaks: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    const fsType = right?.split(' ')[0];
    // nsfs: a hibernated container's kept network namespace
    if (
      (fsType === 'overlay' || fsType === 'erofs' || fsType === 'btrfs' || fsType === 'nsfs') &&
      /sandgym/.test(line)
    )
      leaks.push(`mount: ${left?.split(' ')[4]} (${fsType})`);
  }
  // latency sandboxes under sandgym, best-effort ones under their idle parent
  for (const top of ['sandgym', 'sandgym-best-effort']) {
    for (const hierarchy of readdirSync('/sys/fs/cgroup')) {
      const parent = join('/sys/fs/cgroup', hierarchy, top);
      try {
        for (const scope of readdirSync(parent, { withFileTypes: true })) {
          if (!scope.isDirectory()) continue;
          const sandboxes = readdirSync(join(parent, scope.name), { withFileTypes: true }).filter((e) =>
            e.isDirectory(),
          );
          for (const entry of sandboxes) leaks.push(`cgroup: ${join(parent, scope.name, entry.name)}`);
          if (sandboxes.length === 0) leaks.push(`cgroup: ${join(parent, scope.name)} (empty scope)`);
        }
      } catch {
        // no sandgym cgroups in this hierarchy
      }
    }
  }
  try {
    for (const ns of execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n')) {
      if (ns.startsWith('sandgym')) leaks.push(`netns: ${ns}`);
    }
  } catch {
    // no iproute2: no named namespaces of ours either
  }
  try {
    for (const line of execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' }).split('\n')) {
      const name = line.split(': ')[1]?.split('@')[0];
      if (name && /^(sgbr|sgv|sgp|sgtu|sgg)\d/.test(name)) leaks.push(`link: ${name}`);
    }
    for (const table of execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' }).split('\n')) {
      if (/ sandgym\d+$/.test(table)) leaks.push(`nftables: ${table}`);
    }
  } catch {
    // no nftables: no tables of ours either
  }
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
      if (state === 'Z') continue; // a zombie holds nothing; its parent reaps it
      const ours = cmdline.includes('crun') || cmdline.includes('qemu-system');
      if (
        cmdline.includes('.sandgym-agent') ||
        (ours && cmdline.includes('.sandgym')) ||
        isUpstreamServer(cmdline)
      ) {
        leaks.push(`process ${pid}: ${cmdline.trim()}`);
      }
      for (const path of openHandlesUnder(TEST_DATA_ROOT, Number(pid)))
        leaks.push(`open handle of process ${pid} (${cmdline.trim().slice(0, 80)}): ${path}`);
    } catch {
      // the process ended while we looked
    }
  }
  return leaks;
}

/** Data folders (nested ones too, as the load-mode tests make) that a platform ran in. */
function dataDirsUnder(dir: string): string[] {
  const found: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (!entry.isDirectory() || entry.name === 'layers' || entry.name === 'store') continue;
    const path = join(dir, entry.name);
    if (readdirSync(path).includes('sandboxes')) found.push(path);
    found.push(...dataDirsUnder(path));
  }
  return found;
}

/**
 * Reaps what an interrupted earlier run left in the test data folders, so this run starts clean:
 * its sandboxes and cgroups through gc, then any layer mount still under the folders.
 */
export async function setup(): Promise<void> {
  reapStaleUpstreams();
  for (const dataDir of dataDirsUnder(TEST_DATA_ROOT)) {
    const platform = await Platform.local({ dataDir, storeDir: STORE_DIR });
    await platform.gc();
    await platform.close();
  }
  const stale = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point.startsWith(`${TEST_DATA_ROOT}/`))
    .sort((a, b) => b.length - a.length);
  for (const point of stale) execFileSync('umount', [point]);
  for (const name of readdirSync(TEST_DATA_ROOT))
    rmSync(join(TEST_DATA_ROOT, name), { recursive: true, force: true });
}

export function teardown(): void {
  const leaks = findLeaks();
  if (leaks.length) {
    console.error(`Leak check failed: the suite left these behind:\n${leaks.join('\n')}`);
    process.exitCode = 1;
    return;
  }
  console.log(
    'leak check: no mounts, cgroups, network namespaces, links, nftables tables, processes or open handles left behind',
  );
}
