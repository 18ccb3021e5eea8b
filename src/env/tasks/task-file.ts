import { join } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { parse as parseYaml } from 'yaml';
import { SandgymError, readTextBeneath, resolveBeneath } from '../../common/index.ts';

/** Each format's parser, taking the text alone. */
const PARSERS: Record<'TOML' | 'YAML', (text: string) => unknown> = {
  TOML: (text) => parseToml(text),
  YAML: (text) => parseYaml(text) as unknown,
};

/**
 * A task's configuration file (task.toml, task.yaml, a compose file) parsed, for a schema to
 * check next; a file that does not parse is bad input that names the file and the first line of
 * the parser's complaint. It is read as {@link readTaskText} reads.
 */
export async function readTaskFile(
  dir: string,
  name: string,
  format: keyof typeof PARSERS,
): Promise<unknown> {
  const text = await readTaskText(dir, name);
  const path = join(dir, name);
  try {
    return PARSERS[format](text);
  } catch (error) {
    const why = (error as Error).message.split('\n')[0];
    throw new SandgymError('invalid_argument', `${path} is not valid ${format}: ${why}`, { cause: error });
  }
}

/**
 * A file of a task's folder as text: found beneath the folder (a symlink may not lead out, so
 * the parser's complaint can only ever quote the task's own bytes) and read only when it is a
 * regular file (a FIFO would stall the loader for ever).
 */
export function readTaskText(dir: string, name: string): Promise<string> {
  return readTextBeneath(dir, name, `Task file ${join(dir, name)}`);
}

/** A path of a task's folder on the host, found beneath it (see {@link resolveBeneath}). */
export function taskPath(dir: string, name: string): Promise<string> {
  return resolveBeneath(dir, name, `Task ${dir}:`);
}
