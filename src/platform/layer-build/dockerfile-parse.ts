import { SandgymError } from '../../common/index.ts';

/** One instruction of the supported Dockerfile subset, with the line it started on. */
export type DockerInstruction =
  | { line: number; kind: 'FROM'; environment: string }
  | { line: number; kind: 'RUN'; argv: string[] }
  | { line: number; kind: 'COPY' | 'ADD'; sources: string[]; destination: string }
  | { line: number; kind: 'ENV'; values: Record<string, string> }
  | { line: number; kind: 'WORKDIR'; path: string }
  | { line: number; kind: 'USER'; user: string };

const SUPPORTED = 'FROM, RUN, COPY, ADD, ENV, WORKDIR, USER';

function fail(file: string, line: number, why: string): never {
  throw new SandgymError('invalid_argument', `${file} line ${line}: ${why}`);
}

/** A JSON array of strings ("exec form"), or undefined when the text is not one. */
function execForm(file: string, line: number, rest: string): string[] | undefined {
  if (!rest.startsWith('[')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(rest);
  } catch {
    fail(file, line, 'the JSON form must be an array of strings, e.g. ["make", "install"]');
  }
  if (!Array.isArray(parsed) || parsed.length === 0 || parsed.some((p) => typeof p !== 'string')) {
    fail(file, line, 'the JSON form must be a non-empty array of strings');
  }
  return parsed as string[];
}

/** Splits on spaces, honouring double quotes: enough for COPY, ADD and ENV arguments. */
function words(rest: string): string[] {
  return [...rest.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((m) =>
    m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : (m[2] ?? ''),
  );
}

function parseEnv(file: string, line: number, rest: string): Record<string, string> {
  const parts = words(rest);
  const values: Record<string, string> = {};
  if (parts.length === 2 && !parts[0]?.includes('=')) {
    values[parts[0] ?? ''] = parts[1] ?? ''; // legacy "ENV KEY value"
  } else {
    for (const part of parts) {
      const eq = part.indexOf('=');
      if (eq <= 0) fail(file, line, `ENV needs KEY=value pairs, got "${part}"`);
      values[part.slice(0, eq)] = part.slice(eq + 1);
    }
  }
  for (const key of Object.keys(values)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key))
      fail(file, line, `"${key}" is not a valid environment variable name`);
  }
  return values;
}

/** Parses the Dockerfile subset; every error names the file and line. */
export function parseDockerfile(text: string, file: string): DockerInstruction[] {
  const instructions: DockerInstruction[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const start = i + 1;
    let logical = lines[i] ?? '';
    if (/^\s*(#|$)/.test(logical)) continue;
    while (logical.trimEnd().endsWith('\\') && i + 1 < lines.length) {
      logical = `${logical.trimEnd().slice(0, -1)} ${lines[++i] ?? ''}`;
    }
    const match = /^\s*(\S+)\s*(.*)$/.exec(logical.trim());
    const keyword = (match?.[1] ?? '').toUpperCase();
    const rest = (match?.[2] ?? '').trim();
    if (instructions.length === 0 && keyword !== 'FROM')
      fail(file, start, `the first instruction must be FROM, not ${keyword}`);
    if (!rest) fail(file, start, `${keyword} needs an argument`);
    switch (keyword) {
      case 'FROM': {
        const [environment, ...extra] = rest.split(/\s+/);
        if (extra.length) fail(file, start, 'FROM takes one environment (FROM ... AS name is not supported)');
        if (instructions.length) fail(file, start, 'only one FROM is supported (no multi-stage builds)');
        instructions.push({ line: start, kind: 'FROM', environment: environment ?? '' });
        break;
      }
      case 'RUN':
        instructions.push({
          line: start,
          kind: 'RUN',
          argv: execForm(file, start, rest) ?? ['/bin/sh', '-c', rest],
        });
        break;
      case 'COPY':
      case 'ADD': {
        if (rest.startsWith('--'))
          fail(file, start, `${keyword} flags such as ${rest.split(/\s/)[0]} are not supported`);
        const parts = execForm(file, start, rest) ?? words(rest);
        if (parts.length < 2) fail(file, start, `${keyword} needs a source and a destination`);
        const sources = parts.slice(0, -1);
        if (keyword === 'ADD' && sources.some((s) => /^[a-z]+:\/\//i.test(s)))
          fail(file, start, 'ADD from a URL is not supported; only local files');
        instructions.push({
          line: start,
          kind: keyword,
          sources,
          destination: parts[parts.length - 1] ?? '',
        });
        break;
      }
      case 'ENV':
        instructions.push({ line: start, kind: 'ENV', values: parseEnv(file, start, rest) });
        break;
      case 'WORKDIR':
        instructions.push({ line: start, kind: 'WORKDIR', path: rest });
        break;
      case 'USER':
        instructions.push({ line: start, kind: 'USER', user: rest });
        break;
      default:
        fail(file, start, `unsupported instruction ${keyword} (supported: ${SUPPORTED})`);
    }
  }
  if (instructions.length === 0) throw new SandgymError('invalid_argument', `${file} has no instructions`);
  return instructions;
}
