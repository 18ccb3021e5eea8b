/**
 * Where a sandbox keeps the state of its shell sessions: inside itself, so checkpoints keep it,
 * in a folder per user (`-UID` appended). One user's session state is code another user's session
 * would run, so each user's folder must be its own, 0700, and never a link: in /tmp, sticky, no
 * other user can then swap it. A folder someone else made first is refused, never used.
 */
const SESSIONS_DIR = '/tmp/.sandgym-sessions';

/** The variable that carries a shell line into a session without any quoting of our own. */
const LINE_VARIABLE = 'SANDGYM_SESSION_LINE';

/**
 * A command run in a named shell session: it starts in the session's last working directory,
 * with the variables the session exported so far, and saves both when it ends. There is no
 * long-lived shell: the state is two files in the sandbox, which keeps steps independent,
 * replayable and cheap. A command that ends its shell early (`exit`) does not save the state.
 */
export function inSession(
  session: string,
  command: string | string[],
  cwd: string | undefined,
): { argv: string[]; env: Record<string, string> } {
  const run =
    typeof command === 'string'
      ? `__sg_line=$${LINE_VARIABLE}; unset ${LINE_VARIABLE}; eval "$__sg_line"`
      : '"$@"';
  const script = [
    `__sg_base=${SESSIONS_DIR}-$(id -u)`,
    'mkdir -m 700 "$__sg_base" 2>/dev/null',
    '__sg_owner=$(ls -ldn "$__sg_base" 2>/dev/null | { read -r _ _ owner _; echo "$owner"; })',
    'if [ -L "$__sg_base" ] || [ ! -d "$__sg_base" ] || [ "$__sg_owner" != "$(id -u)" ]; then',
    `  echo "sandgym: $__sg_base is not this user's own folder, so the session's state cannot be kept there safely: remove it" >&2`,
    '  exit 125',
    'fi',
    'chmod 700 "$__sg_base"',
    `__sg_dir="$__sg_base/${session}"`,
    'mkdir -p "$__sg_dir"',
    '[ -f "$__sg_dir/env" ] && . "$__sg_dir/env"',
    '[ -f "$__sg_dir/cwd" ] && cd "$(cat "$__sg_dir/cwd")" 2>/dev/null',
    // an explicit cwd for this command wins over the session's
    ...(cwd ? ['cd "$__sg_cwd"', 'unset __sg_cwd'] : []),
    run,
    '__sg_status=$?',
    'pwd > "$__sg_dir/cwd"',
    'export -p > "$__sg_dir/env"',
    'exit $__sg_status',
  ].join('\n');
  const env: Record<string, string> = {};
  if (typeof command === 'string') env[LINE_VARIABLE] = command;
  if (cwd) env['__sg_cwd'] = cwd;
  return {
    argv: ['/bin/sh', '-c', script, 'sandgym-session', ...(typeof command === 'string' ? [] : command)],
    env,
  };
}
