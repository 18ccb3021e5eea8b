import { mkdir, readFile, writeFile } from 'node:fs/promises';
import type { Logger } from '../../common/index.ts';

/**
 * The kernel's protections against links and files one user leaves in a sticky world-writable
 * folder (/tmp) for another to follow or open with O_CREAT, at the values hardened distributions
 * ship. A sandbox whose agent runs as one user and whose tests, services or entrypoint run as root
 * depends on them: without them a link the agent leaves in /tmp redirects root's writes anywhere.
 * They are fs.* sysctls of the whole kernel, not of a namespace: the host's values hold in every
 * container on it, and a container cannot set its own (a microvm's guest kernel has its own).
 */
const LINK_PROTECTIONS: Readonly<Record<string, number>> = {
  protected_symlinks: 1,
  protected_hardlinks: 1,
  protected_fifos: 2,
  protected_regular: 2,
};

/** Where `sandgym setup` keeps them across reboots. */
const SYSCTL_CONF = '/etc/sysctl.d/60-sandgym-link-protections.conf';

/** The protections below {@link LINK_PROTECTIONS} on this host, as `fs.NAME=VALUE` (want W). */
export async function weakLinkProtections(): Promise<string[]> {
  const weak: string[] = [];
  for (const [name, wanted] of Object.entries(LINK_PROTECTIONS)) {
    const text = await readFile(`/proc/sys/fs/${name}`, 'utf8').catch(() => undefined);
    // a kernel without the knob has no such protection either
    const value = text === undefined ? -1 : Number(text.trim());
    if (!(value >= wanted))
      weak.push(`fs.${name}=${text === undefined ? 'missing' : value} (want ${wanted})`);
  }
  return weak;
}

/**
 * Sets {@link LINK_PROTECTIONS} now and for every boot: part of preparing the host. A value
 * already stricter is kept.
 */
export async function setLinkProtections(logger: Logger): Promise<void> {
  const lines: string[] = [];
  for (const [name, wanted] of Object.entries(LINK_PROTECTIONS)) {
    const path = `/proc/sys/fs/${name}`;
    const value = Number((await readFile(path, 'utf8')).trim());
    const kept = Math.max(value, wanted);
    if (value < wanted) {
      logger.info({ sysctl: `fs.${name}`, from: value, to: wanted }, 'hardening link protections');
      await writeFile(path, String(wanted));
    }
    lines.push(`fs.${name} = ${kept}`);
  }
  await mkdir('/etc/sysctl.d', { recursive: true });
  await writeFile(SYSCTL_CONF, `# written by sandgym setup: see docs/security.md\n${lines.join('\n')}\n`);
}
