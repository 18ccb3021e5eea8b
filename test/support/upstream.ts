import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * A stand-in for a package mirror: a network namespace the test makes, joined to the host by a
 * veth pair on a /30 of its own, with HTTP servers on the ports asked for. Each serves
 * `/id`, which answers `port <N>`. Nothing in it reaches beyond this host.
 */
export interface Upstream extends AsyncDisposable {
  /** The server's address, as sandboxes see it. */
  address: string;
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: 'pipe' });
}

/** Options for {@link startUpstream}. */
export interface UpstreamOptions {
  /**
   * More addresses the namespace answers on (a link-local one, say), each routed to it from the
   * host; the servers then listen on every address of the namespace.
   */
  aliases?: string[];
}

/** `index` keeps concurrent test files apart (0-63). */
export async function startUpstream(
  index: number,
  ports: number[],
  options: UpstreamOptions = {},
): Promise<Upstream> {
  const aliases = options.aliases ?? [];
  const name = `sandgym-test-upstream${index}`;
  const hostLink = `sgtu${index}`;
  const base = `10.250.${index}`;
  const servers: ChildProcess[] = [];
  const root = mkdtempSync(join(tmpdir(), UPSTREAM_DIR_MARK));
  const dispose = async (): Promise<void> => {
    for (const server of servers) server.kill('SIGKILL');
    await sleep(50);
    for (const cleanup of [() => ip('link', 'del', hostLink), () => ip('netns', 'del', name)]) {
      try {
        cleanup();
      } catch {
        // already gone
      }
    }
    rmSync(root, { recursive: true, force: true });
  };
  try {
    ip('netns', 'add', name);
    ip('link', 'add', hostLink, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name);
    ip('addr', 'add', `${base}.1/30`, 'dev', hostLink);
    ip('link', 'set', hostLink, 'up');
    ip('-n', name, 'addr', 'add', `${base}.2/30`, 'dev', 'eth0');
    ip('-n', name, 'link', 'set', 'eth0', 'up');
    ip('-n', name, 'link', 'set', 'lo', 'up');
    for (const alias of aliases) {
      ip('-n', name, 'addr', 'add', `${alias}/32`, 'dev', 'eth0');
      // the route goes with the host link
      ip('route', 'add', `${alias}/32`, 'via', `${base}.2`, 'dev', hostLink);
    }
    for (const port of ports) {
      const dir = join(root, String(port));
      execFileSync('mkdir', ['-p', dir]);
      writeFileSync(join(dir, 'id'), `port ${port}\n`);
      servers.push(
        spawn(
          'ip',
          [
            ...['netns', 'exec', name, 'busybox', 'httpd', '-f'],
            ...['-p', aliases.length ? String(port) : `${base}.2:${port}`, '-h', dir],
          ],
          { stdio: 'ignore' },
        ),
      );
    }
    await sleep(200);
  } catch (error) {
    await dispose();
    throw error;
  }
  return { address: `${base}.2`, [Symbol.asyncDispose]: dispose };
}

/** Where an upstream's servers serve from: what names their processes. */
export const UPSTREAM_DIR_MARK = 'sandgym-upstream-';

/** Whether a process command line is an upstream's server. */
export function isUpstreamServer(cmdline: string): boolean {
  return cmdline.includes('httpd') && cmdline.includes(`/${UPSTREAM_DIR_MARK}`);
}

/**
 * Removes what an interrupted earlier run left of its upstreams: servers (which outlive a killed
 * test worker), namespaces and host links, so a new run can make them again. Upstreams whose
 * test worker is alive belong to a run going on beside this one (another worktree's) and stay.
 */
export function reapStaleUpstreams(): void {
  const live = new Set<string>();
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (!isUpstreamServer(readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' '))) continue;
      const parent = Number(/^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 1);
      // a server a live test worker started (or a connection's child of one): its run goes on
      if (isTestWorkerOrServer(parent)) {
        live.add(execFileSync('ip', ['netns', 'identify', pid], { encoding: 'utf8' }).trim());
        continue;
      }
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      // ended while we looked
    }
  }
  const namespaces = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  for (const name of namespaces.split('\n').map((line) => line.split(' ')[0] ?? '')) {
    if (name.startsWith('sandgym-test-upstream') && !live.has(name)) ip('netns', 'del', name);
  }
}

/** Whether `pid` is a Node process (a test worker) or an upstream's server. */
function isTestWorkerOrServer(pid: number): boolean {
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
    return (
      pid > 1 && (readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'node' || isUpstreamServer(cmdline))
    );
  } catch {
    return false;
  }
}
