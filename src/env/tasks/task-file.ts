import { readFile } from 'node:fs/promises';
import { parse as parseToml } from 'smol-toml';
import { parse as parseYaml } from 'yaml';
import { SandgymError } from '../../common/index.ts';

/** Each format's parser, taking the text alone. */
const PARSERS: Record<'TOML' | 'YAML', (text: string) => unknown> = {
  TOML: (text) => parseToml(text),
  YAML: (text) => parseYaml(text) as unknown,
};

/**
 * A task's configuration file (task.toml, task.yaml, a compose file) parsed, for a schema to
 * check next; a file that does not parse is bad input that names the file and the first line of
 * the parser's complaint.
 */
export async function readTaskFile(path: string, format: keyof typeof PARSERS): Promise<unknown> {
  const text = await readFile(path, 'utf8');
  try {
    return PARSERS[format](text);
  } catch (error) {
    const why = (error as Error).message.split('\n')[0];
    throw new SandgymError('invalid_argument', `${path} is not valid ${format}: ${why}`, { cause: error });
  }
}
