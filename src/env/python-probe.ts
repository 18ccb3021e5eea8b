import { posix } from 'node:path';
import { z } from 'zod';
import { parseAt } from '../common/index.ts';
import type { Sandbox } from '../platform/index.ts';

/**
 * What a clean sandbox of an environment runs a verifier with: the folders on its PATH, and for
 * its `python3` the folders on the module path, every top-level module name they provide, and
 * the modules its start-up asks for that the environment does not have (Debian's stock
 * sitecustomize asks for `apport_python_hook`, which anything later on the path could supply).
 * `linkHops` are the paths the symbolic links of those folders go through and end at
 * (`/usr/bin/awk` → `/etc/alternatives/awk` → `/usr/bin/mawk`): a diff that repoints one of them
 * replaces the tool as surely as writing the folder would.
 */
export interface InterpreterFacts {
  pathDirs: string[];
  linkHops: string[];
  python?: { sitePaths: string[]; modules: string[]; missingStartupModules: string[] };
}

const factsSchema = z.object({
  path: z.string(),
  sitePaths: z.array(z.string()),
  modules: z.array(z.string()),
  missingStartupModules: z.array(z.string()),
});

/**
 * Run with -S, so site's start-up work happens under a finder that records every module asked
 * for: the .pth files and sitecustomize/usercustomize exactly as a normal start runs them.
 */
const PROBE = `import json, os, sys
asked = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        asked.append(name.split('.')[0])
        return None
recorder = Recorder()
sys.meta_path.insert(0, recorder)
import site
site.main()
sys.meta_path.remove(recorder)
dirs, names = [], set()
for entry in sys.path:
    if not entry or not os.path.isdir(entry):
        continue
    dirs.append(os.path.realpath(entry))
    for child in os.listdir(entry):
        stem = child.split('.', 1)[0]
        if stem.isidentifier():
            names.add(stem)
missing = sorted({name for name in asked if name not in names and name not in sys.builtin_module_names})
print(json.dumps({'path': os.environ.get('PATH', ''), 'sitePaths': dirs, 'modules': sorted(names),
                  'missingStartupModules': missing}))
`;

/**
 * Prints, for every symbolic link in the folders given as arguments, each path its chain goes
 * through after it (eight hops at most), one per line: what a replaced tool could hide behind.
 */
const LINK_PROBE = `for d in "$@"; do
  for f in "$d"/*; do
    p=$f; n=0
    while [ -L "$p" ] && [ $n -lt 8 ]; do
      t=$(readlink "$p") || break
      case $t in /*) ;; *) t=\${p%/*}/$t ;; esac
      printf '%s\\n' "$t"; p=$t; n=$((n + 1))
    done
  done
done`;

/** How long the probe may take: one interpreter start and a listing of its module folders. */
const PROBE_TIMEOUT_MS = 60_000;

/** The default PATH of a sandbox whose environment sets none (as the agent's own). */
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Probes a sandbox that nothing has run in yet. An environment without python3 has no Python facts. */
export async function probeInterpreters(sandbox: Sandbox): Promise<InterpreterFacts> {
  const run = await sandbox.exec(['python3', '-S', '-c', PROBE], { timeoutMs: PROBE_TIMEOUT_MS });
  if (run.exitCode !== 0) {
    const path = (await sandbox.exec(['sh', '-c', 'printf %s "$PATH"'], { timeoutMs: PROBE_TIMEOUT_MS }))
      .stdout;
    const pathDirs = splitPath(path || DEFAULT_PATH);
    return { pathDirs, linkHops: await linkHops(sandbox, pathDirs) };
  }
  const facts = parseAt(factsSchema, JSON.parse(run.stdout), `interpreter probe of ${sandbox.id}`);
  const pathDirs = splitPath(facts.path || DEFAULT_PATH);
  return {
    pathDirs,
    linkHops: await linkHops(sandbox, pathDirs),
    python: {
      sitePaths: facts.sitePaths,
      modules: facts.modules,
      missingStartupModules: facts.missingStartupModules,
    },
  };
}

/** The hops of the links in `dirs` (see {@link InterpreterFacts.linkHops}), normalised. */
async function linkHops(sandbox: Sandbox, dirs: readonly string[]): Promise<string[]> {
  const run = await sandbox.exec(['sh', '-c', LINK_PROBE, 'links', ...dirs], { timeoutMs: PROBE_TIMEOUT_MS });
  return [
    ...new Set(
      run.stdout
        .split('\n')
        .filter((line) => line.startsWith('/'))
        .map((line) => posix.normalize(line)),
    ),
  ];
}

function splitPath(path: string): string[] {
  return [...new Set(path.split(':').filter((dir) => dir.startsWith('/')))];
}
