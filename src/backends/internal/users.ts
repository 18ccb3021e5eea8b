import { SandgymError } from '../../common/index.ts';

/** The most supplementary groups the agent takes for one user (agent/creds.h). */
const MAX_GROUPS = 256;

/** A user to act as, resolved against the sandbox's own /etc/passwd and /etc/group. */
export interface ResolvedUser {
  uid: number;
  gid: number;
  /** Supplementary groups besides `gid`, as /etc/group lists the user in them. */
  groups: number[];
  home: string | undefined;
}

/** Whether `user` is root, who needs no lookup: calls keep the agent's own credentials. */
export function isRootUser(user: string | undefined): user is 'root' | undefined {
  return user === undefined || user === 'root';
}

/** A uid or gid the kernel takes: 2^32 - 1 means "no id" to it. */
function isId(id: number): boolean {
  return Number.isInteger(id) && id >= 0 && id < 2 ** 32 - 1;
}

function table(text: string): string[][] {
  return text
    .split('\n')
    .filter((line) => line && !line.startsWith('#'))
    .map((line) => line.split(':'));
}

/**
 * Resolves "name", "uid", "name:group" or "uid:gid" the way Docker's USER does. Numbers need no
 * entry in the files; names must have one. A user named without a group gets the groups
 * /etc/group lists its name in (a uid with an entry, that entry's name's); naming the group
 * leaves them out, as Docker does. A uid with no entry gets its own number as its group, never
 * root's.
 */
export function resolveUser(spec: string, passwd: string, group: string): ResolvedUser {
  const [userPart = '', groupPart] = spec.split(':');
  const users = table(passwd);
  const groups = table(group);
  const entry = /^\d+$/.test(userPart)
    ? users.find((u) => u[2] === userPart)
    : users.find((u) => u[0] === userPart);
  if (!entry && !/^\d+$/.test(userPart)) {
    throw new SandgymError('invalid_argument', `User "${userPart}" is not in the sandbox's /etc/passwd`);
  }
  const uid = Number(entry?.[2] ?? userPart);
  let gid = Number(entry?.[3] ?? userPart);
  if (groupPart !== undefined) {
    const named = groups.find((g) => g[0] === groupPart);
    if (!named && !/^\d+$/.test(groupPart)) {
      throw new SandgymError('invalid_argument', `Group "${groupPart}" is not in the sandbox's /etc/group`);
    }
    gid = Number(named?.[2] ?? groupPart);
  }
  for (const [what, id] of [
    ['uid', uid],
    ['gid', gid],
  ] as const) {
    if (!isId(id)) {
      throw new SandgymError(
        'invalid_argument',
        `User "${spec}" has no usable ${what} in the sandbox's /etc/passwd and /etc/group`,
      );
    }
  }
  const name = entry?.[0];
  const listed =
    groupPart === undefined && name !== undefined
      ? groups.filter((g) => (g[3] ?? '').split(',').includes(name)).map((g) => Number(g[2]))
      : [];
  const supplementary = [...new Set(listed.filter((id) => isId(id) && id !== gid))];
  if (supplementary.length > MAX_GROUPS) {
    throw new SandgymError(
      'invalid_argument',
      `User "${userPart}" is in ${supplementary.length} groups of the sandbox's /etc/group, more than the ${MAX_GROUPS} a sandbox user may have`,
    );
  }
  return { uid, gid, groups: supplementary, home: entry?.[5] };
}
