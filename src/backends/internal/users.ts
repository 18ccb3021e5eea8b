import { SandgymError } from '../../common/index.ts';

/** A user to run a command as, resolved against the sandbox's own /etc/passwd and /etc/group. */
export interface ResolvedUser {
  uid: number;
  gid: number;
  home: string | undefined;
}

function table(text: string): string[][] {
  return text
    .split('\n')
    .filter((line) => line && !line.startsWith('#'))
    .map((line) => line.split(':'));
}

/**
 * Resolves "name", "uid", "name:group" or "uid:gid" the way Docker's USER does. Numbers need no
 * entry in the files; names must have one.
 */
export function resolveUser(spec: string, passwd: string, group: string): ResolvedUser {
  const [userPart = '', groupPart] = spec.split(':');
  const users = table(passwd);
  const entry = /^\d+$/.test(userPart)
    ? users.find((u) => u[2] === userPart)
    : users.find((u) => u[0] === userPart);
  if (!entry && !/^\d+$/.test(userPart)) {
    throw new SandgymError('invalid_argument', `User "${userPart}" is not in the sandbox's /etc/passwd`);
  }
  const uid = Number(entry?.[2] ?? userPart);
  let gid = Number(entry?.[3] ?? userPart);
  if (groupPart !== undefined) {
    const named = table(group).find((g) => g[0] === groupPart);
    if (!named && !/^\d+$/.test(groupPart)) {
      throw new SandgymError('invalid_argument', `Group "${groupPart}" is not in the sandbox's /etc/group`);
    }
    gid = Number(named?.[2] ?? groupPart);
  }
  return { uid, gid, home: entry?.[5] };
}
