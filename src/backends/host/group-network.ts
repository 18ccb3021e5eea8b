import { mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError } from '../../common/index.ts';
import { isAlive, processIdentity } from './processes.ts';
import { runProgram } from './run-program.ts';

/** Groups per host: one /24 each of 198.18.0.0/15. */
const GROUPS = 512;
/** Members per group: hosts of a /24 less network and broadcast. */
const MEMBERS = 254;
const CLAIMS_DIR = '/run/sandgym/groups';
/** The interface a member sees its group on (its node-network veth, if any, is eth0). */
const MEMBER_INTERFACE = 'grp0';
/** The host-wide table that keeps every group off the host: see {@link GROUP_GUARD}. */
const GUARD_TABLE = 'sandgym_groups';

/**
 * What reaches the host's own stack from a group's bridge is dropped: a member may name any
 * address as on its link (IP_UNICAST_IF needs no privilege), broadcast, or take the host's bridge
 * for a router, and the node network's guard never sees any of it. Input covers the host's
 * addresses and broadcasts; forward covers routing through the host (bridged member-to-member
 * frames, which br_netfilter shows here as in and out of the same bridge, still pass); the
 * wildcard covers every group's bridge, made before or after. Written in one transaction and
 * never removed, so two processes making groups at once both leave it whole, and every bridge
 * is made after it.
 */
const GROUP_GUARD = `
  add table inet ${GUARD_TABLE}
  add chain inet ${GUARD_TABLE} input { type filter hook input priority filter - 10; policy accept; }
  add chain inet ${GUARD_TABLE} forward { type filter hook forward priority filter - 10; policy accept; }
  flush chain inet ${GUARD_TABLE} input
  flush chain inet ${GUARD_TABLE} forward
  add rule inet ${GUARD_TABLE} input iifname "sgg*" drop
  add rule inet ${GUARD_TABLE} forward iifname "sgg*" oifname != "sgg*" drop
  add rule inet ${GUARD_TABLE} forward oifname "sgg*" iifname != "sgg*" drop
`;

/**
 * 198.18.0.0/15 is set aside for benchmarking (RFC 2544) and routed nowhere, so a group's
 * addresses never hide a real destination a sandbox's rules could allow.
 */
function memberAddress(group: number, member: number): string {
  const n = 0xc6120000 + group * 256 + member;
  return [24, 16, 8, 0].map((shift) => (n >>> shift) & 255).join('.');
}

const claimSchema = z.object({ owner: z.object({ pid: z.number(), startTime: z.number() }) });

/**
 * A private network for a group of sandboxes (a task and its docker-compose services): a bridge
 * with no address on the host, so its members reach each other and nothing else through it (the
 * host neither routes nor answers there), one veth per member. Members keep their own
 * namespaces; each gets an address of the group's /24 on `grp0`. The claim (an atomic mkdir
 * under /run/sandgym/groups) records its owner, so what a crashed owner left is removed.
 */
export class GroupNetwork {
  /** Member number → its address; and address → its host-side veth, for leaving. */
  private readonly members = new Map<number, string>();
  private readonly veths = new Map<string, string>();
  private closed = false;

  private constructor(readonly index: number) {}

  get bridge(): string {
    return `sgg${this.index}`;
  }

  static async create(): Promise<GroupNetwork> {
    await mkdir(CLAIMS_DIR, { recursive: true });
    await removeStaleGroups();
    for (let index = 0; index < GROUPS; index++) {
      const claim = join(CLAIMS_DIR, String(index));
      try {
        await mkdir(claim);
      } catch {
        continue;
      }
      const group = new GroupNetwork(index);
      try {
        await writeFile(
          join(claim, 'owner.json'),
          JSON.stringify({ owner: await processIdentity(process.pid) }),
        );
        await runProgram('nft', ['-f', '-'], { input: GROUP_GUARD });
        // no address of either family on the host's end, and no answer to who has one: members
        // never learn the host's link address, so nothing they send is for the host
        await runProgram('sh', [
          '-c',
          [
            'ip link del "$1" 2>/dev/null; ip link add "$1" type bridge',
            'echo 1 > /proc/sys/net/ipv6/conf/"$1"/disable_ipv6',
            'echo 8 > /proc/sys/net/ipv4/conf/"$1"/arp_ignore',
            'ip link set "$1" up',
          ].join(' && '),
          'sh',
          group.bridge,
        ]);
      } catch (error) {
        await group.close().catch(() => undefined);
        throw error;
      }
      return group;
    }
    throw new SandgymError(
      'resource_exhausted',
      `All ${GROUPS} sandbox group networks of this host are in use`,
      {
        retryable: true,
      },
    );
  }

  /** Puts the network namespace of `pid` on the group; returns the address it has there. */
  async join(pid: number): Promise<string> {
    if (this.closed) throw new SandgymError('failed_precondition', 'The group network is closed');
    const member = [...Array(MEMBERS).keys()].map((i) => i + 1).find((i) => !this.members.has(i));
    if (member === undefined)
      throw new SandgymError('resource_exhausted', `A group holds at most ${MEMBERS} sandboxes`);
    const address = memberAddress(this.index, member);
    this.members.set(member, address);
    const host = `sgg${this.index}v${member}`;
    try {
      await runProgram('sh', [
        '-c',
        [
          'ip link add "$1" type veth peer name "$2"',
          'ip link set "$2" netns "$3"',
          'ip link set "$1" master "$4"',
          'ip link set "$1" up',
          // inside: no IPv6, one address on the group's /24 (its route comes with it)
          `nsenter --net=/proc/"$3"/ns/net sh -c 'ip link set "$1" name ${MEMBER_INTERFACE} && echo 1 > /proc/sys/net/ipv6/conf/${MEMBER_INTERFACE}/disable_ipv6 && ip addr add "$2" dev ${MEMBER_INTERFACE} && ip link set ${MEMBER_INTERFACE} up && ip link set lo up' sh "$2" "$5/24"`,
        ].join(' && '),
        'sh',
        host,
        `sggp${this.index}v${member}`,
        String(pid),
        this.bridge,
        address,
      ]);
    } catch (error) {
      this.members.delete(member);
      await runProgram('sh', ['-c', 'ip link del "$1" 2>/dev/null || true', 'sh', host]);
      throw error;
    }
    this.veths.set(address, host);
    return address;
  }

  /** Takes the member at `address` off the group (its veth goes); its number is free again. */
  async leave(address: string): Promise<void> {
    const host = this.veths.get(address);
    if (!host) return;
    await runProgram('sh', ['-c', 'ip link del "$1" 2>/dev/null || true', 'sh', host]);
    this.veths.delete(address);
    for (const [member, a] of this.members) if (a === address) this.members.delete(member);
  }

  /** Removes the bridge, every member's veth and the claim. Idempotent. */
  async close(): Promise<void> {
    this.closed = true;
    await removeGroup(this.index);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

async function removeGroup(index: number): Promise<void> {
  await runProgram('sh', [
    '-c',
    `for l in $(ip -o link show master "$1" 2>/dev/null | awk -F'[:@ ]+' '{print $2}'); do ip link del "$l"; done; ip link del "$1" 2>/dev/null; true`,
    'sh',
    `sgg${index}`,
  ]);
  await rm(join(CLAIMS_DIR, String(index)), { recursive: true, force: true });
}

/** Removes the group networks whose owner died without closing them. */
export async function removeStaleGroups(): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await readdir(CLAIMS_DIR).catch(() => [] as string[])) {
    const index = Number(name);
    if (!Number.isInteger(index)) continue;
    const claim = await readFile(join(CLAIMS_DIR, name, 'owner.json'), 'utf8')
      .then((text) => claimSchema.parse(JSON.parse(text)))
      .catch(() => undefined);
    // a claim without its owner file is one being made right now, unless its bridge never came
    if (claim ? await isAlive(claim.owner) : await bridgeExists(index)) continue;
    await removeGroup(index);
    removed.push(`sgg${index}`);
  }
  return removed;
}

function bridgeExists(index: number): Promise<boolean> {
  return runProgram('ip', ['link', 'show', `sgg${index}`]).then(
    () => true,
    () => false,
  );
}
