import { ENV_VAR_NAME, SandgymError } from '../../common/index.ts';

/** A command as written: the JSON ("exec") form, or a line for the shell. */
export type Command = { form: 'exec'; argv: string[] } | { form: 'shell'; text: string };

/** A here-document: `<<EOF` … `EOF` after an instruction, its body the lines between. */
export interface Heredoc {
  name: string;
  body: string;
  /** Unquoted markers (`<<EOF`, not `<<"EOF"`) have variables expanded in their body. */
  expands: boolean;
}

/** Flags written `--name=value` (or `--name`) before an instruction's arguments. */
export type Flags = Readonly<Record<string, string | true>>;

/** One instruction of a Dockerfile, with the line it started on; arguments as written. */
export type DockerInstruction = { line: number; text: string } & (
  | { kind: 'FROM'; image: string; stage?: string; platform?: string }
  | { kind: 'ARG'; name: string; value?: string }
  | { kind: 'RUN'; command: Command; heredocs: Heredoc[]; flags: Flags }
  | { kind: 'COPY' | 'ADD'; sources: string[]; destination: string; heredocs: Heredoc[]; flags: Flags }
  | { kind: 'ENV' | 'LABEL'; raw: string }
  | { kind: 'WORKDIR'; path: string }
  | { kind: 'USER'; user: string }
  | { kind: 'SHELL'; argv: string[] }
  | { kind: 'CMD' | 'ENTRYPOINT'; command: Command }
  | { kind: 'EXPOSE' | 'VOLUME'; raw: string }
  | { kind: 'HEALTHCHECK' | 'STOPSIGNAL' | 'ONBUILD' | 'MAINTAINER'; raw: string }
);

/** Instructions that take no arguments' content at build time beyond metadata. */
const KEYWORDS = [
  'FROM',
  'ARG',
  'RUN',
  'COPY',
  'ADD',
  'ENV',
  'LABEL',
  'WORKDIR',
  'USER',
  'SHELL',
  'CMD',
  'ENTRYPOINT',
  'EXPOSE',
  'VOLUME',
  'HEALTHCHECK',
  'STOPSIGNAL',
  'ONBUILD',
  'MAINTAINER',
] as const;
type Keyword = (typeof KEYWORDS)[number];

/** The flags each instruction takes; any other is an error naming it. */
const KNOWN_FLAGS: Partial<Record<Keyword, readonly string[]>> = {
  FROM: ['platform'],
  RUN: ['mount', 'network', 'security'],
  COPY: ['from', 'chown', 'chmod', 'link', 'parents', 'exclude'],
  ADD: ['chown', 'chmod', 'link', 'checksum', 'keep-git-dir', 'exclude'],
};

/** A syntax error, naming the file and line. */
export function fail(file: string, line: number, why: string): never {
  throw new SandgymError('invalid_argument', `${file} line ${line}: ${why}`);
}

/** A JSON array of strings (exec form), or undefined when the text is not meant as one. */
function execForm(file: string, line: number, rest: string): string[] | undefined {
  if (!rest.startsWith('[')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(rest);
  } catch {
    // Docker runs a line that starts with "[" but is no JSON array through the shell
    return undefined;
  }
  if (!Array.isArray(parsed) || parsed.length === 0 || parsed.some((p) => typeof p !== 'string'))
    fail(file, line, 'the JSON form must be a non-empty array of strings, e.g. ["make", "install"]');
  return parsed as string[];
}

/**
 * Splits arguments into words as Docker does: on white space, with single quotes taken
 * literally, double quotes grouping (a backslash escapes inside them), and backslash escapes
 * outside quotes.
 */
export function splitWords(text: string, escape = '\\'): string[] {
  const words: string[] = [];
  let word = '';
  let started = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i] ?? '';
    if (/\s/.test(c)) {
      if (started) words.push(word);
      word = '';
      started = false;
      continue;
    }
    started = true;
    if (c === escape && i + 1 < text.length) {
      word += text[++i];
    } else if (c === "'") {
      const end = text.indexOf("'", i + 1);
      word += text.slice(i + 1, end < 0 ? text.length : end);
      i = end < 0 ? text.length : end;
    } else if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) {
        if (text[i] === escape && (text[i + 1] === '"' || text[i + 1] === escape)) i++;
        word += text[i];
      }
    } else {
      word += c;
    }
  }
  if (started) words.push(word);
  return words;
}

/** Leading `--name[=value]` flags and what follows them. */
function takeFlags(
  file: string,
  line: number,
  keyword: Keyword,
  rest: string,
): { flags: Record<string, string | true>; rest: string } {
  const flags: Record<string, string | true> = {};
  let remaining = rest;
  for (;;) {
    const match = /^--([a-z][a-z-]*)(?:=("[^"]*"|\S*))?(\s+|$)/.exec(remaining);
    if (!match) break;
    const name = match[1] ?? '';
    if (!(KNOWN_FLAGS[keyword] ?? []).includes(name))
      fail(
        file,
        line,
        `${keyword} does not take --${name} (it takes ${(KNOWN_FLAGS[keyword] ?? []).map((f) => `--${f}`).join(', ') || 'no flags'})`,
      );
    const value = match[2];
    const previous = flags[name];
    // --mount and --exclude may repeat; the others take their last value
    const text = value === undefined ? true : value.replace(/^"(.*)"$/, '$1');
    flags[name] = typeof previous === 'string' && typeof text === 'string' ? `${previous}\n${text}` : text;
    remaining = remaining.slice(match[0].length);
  }
  return { flags, rest: remaining.trim() };
}

/** The here-document markers of a line (`<<EOF`, `<<-EOF`, `<<"EOF"`), in order. */
function heredocMarkers(text: string): { name: string; strip: boolean; expands: boolean }[] {
  return [...text.matchAll(/<<(-?)(["']?)([A-Za-z_][A-Za-z0-9_]*)\2/g)].map((m) => ({
    name: m[3] ?? '',
    strip: m[1] === '-',
    expands: m[2] === '',
  }));
}

/** The parser directives at the top of a file (`# escape=\``, `# syntax=...`). */
function directives(lines: string[], file: string): { escape: string; skip: number } {
  let escape = '\\';
  let skip = 0;
  for (const line of lines) {
    const match = /^#\s*([a-z]+)\s*=\s*(\S+)\s*$/i.exec(line);
    if (!match) break;
    if ((match[1] ?? '').toLowerCase() === 'escape') {
      if (match[2] !== '\\' && match[2] !== '`') fail(file, skip + 1, 'escape must be \\ or `');
      escape = match[2];
    }
    skip++;
  }
  return { escape, skip };
}

/**
 * Parses a Dockerfile: instructions with their line, continuation lines joined (comment lines
 * inside them dropped), here-documents read, flags and JSON forms recognised. Arguments keep
 * their variables: the builder expands them in the scope each instruction runs in. Every error
 * names the file and line.
 */
export function parseDockerfile(text: string, file: string): ParsedDockerfile {
  const lines = text.replace(/\r\n/g, '\n').split('\n');
  const { escape, skip } = directives(lines, file);
  const instructions: DockerInstruction[] = [];
  for (let i = skip; i < lines.length; i++) {
    const start = i + 1;
    let logical = lines[i] ?? '';
    if (/^\s*(#|$)/.test(logical)) continue;
    while (logical.trimEnd().endsWith(escape) && i + 1 < lines.length) {
      logical = logical.trimEnd().slice(0, -1);
      // comment lines inside a continuation are not part of it
      while (i + 1 < lines.length && /^\s*#/.test(lines[i + 1] ?? '')) i++;
      if (i + 1 < lines.length) logical += ` ${lines[++i] ?? ''}`;
    }
    const match = /^\s*(\S+)\s*(.*)$/s.exec(logical.trim());
    const keyword = (match?.[1] ?? '').toUpperCase() as Keyword;
    const rest = (match?.[2] ?? '').trim();
    if (!KEYWORDS.includes(keyword))
      fail(
        file,
        start,
        `unknown instruction ${match?.[1] ?? ''} (Dockerfile instructions: ${KEYWORDS.join(', ')})`,
      );
    if (instructions.filter((x) => x.kind !== 'ARG').length === 0 && keyword !== 'FROM' && keyword !== 'ARG')
      fail(file, start, `the first instruction must be FROM (or ARG before it), not ${keyword}`);
    if (!rest) fail(file, start, `${keyword} needs an argument`);
    const heredocs: Heredoc[] = [];
    if (keyword === 'RUN' || keyword === 'COPY' || keyword === 'ADD') {
      for (const marker of heredocMarkers(rest)) {
        const body: string[] = [];
        for (;;) {
          if (++i >= lines.length)
            fail(file, start, `here-document <<${marker.name} has no closing ${marker.name} line`);
          const raw = lines[i] ?? '';
          const line = marker.strip ? raw.replace(/^\t+/, '') : raw;
          if (line === marker.name) break;
          body.push(line);
        }
        heredocs.push({ name: marker.name, body: `${body.join('\n')}\n`, expands: marker.expands });
      }
    }
    instructions.push(instruction(file, start, keyword, rest, heredocs, escape));
  }
  if (!instructions.some((x) => x.kind === 'FROM'))
    throw new SandgymError('invalid_argument', `${file} has no FROM instruction`);
  return { instructions, escape };
}

/** A parsed Dockerfile: its instructions and its escape character (`\\` unless a directive says). */
export interface ParsedDockerfile {
  instructions: DockerInstruction[];
  escape: string;
}

function instruction(
  file: string,
  line: number,
  keyword: Keyword,
  rest: string,
  heredocs: Heredoc[],
  escape: string,
): DockerInstruction {
  const text = `${keyword} ${rest}`;
  switch (keyword) {
    case 'FROM': {
      const { flags, rest: args } = takeFlags(file, line, keyword, rest);
      const words = args.split(/\s+/);
      const [image = '', as, stage, ...extra] = words;
      if ((as !== undefined && (as.toLowerCase() !== 'as' || !stage)) || extra.length)
        fail(file, line, 'FROM takes an image and optionally AS name: FROM image[:tag] [AS name]');
      return {
        line,
        text,
        kind: 'FROM',
        image,
        ...(stage ? { stage: stage.toLowerCase() } : {}),
        ...(typeof flags['platform'] === 'string' ? { platform: flags['platform'] } : {}),
      };
    }
    case 'ARG': {
      const eq = rest.indexOf('=');
      const name = (eq < 0 ? rest : rest.slice(0, eq)).trim();
      if (!ENV_VAR_NAME.test(name)) fail(file, line, `"${name}" is not a valid ARG name`);
      const value = eq < 0 ? undefined : (splitWords(rest.slice(eq + 1), escape)[0] ?? '');
      return { line, text, kind: 'ARG', name, ...(value === undefined ? {} : { value }) };
    }
    case 'RUN': {
      const { flags, rest: args } = takeFlags(file, line, keyword, rest);
      const argv = heredocs.length ? undefined : execForm(file, line, args);
      return {
        line,
        text,
        kind: 'RUN',
        command: argv ? { form: 'exec', argv } : { form: 'shell', text: args },
        heredocs,
        flags,
      };
    }
    case 'COPY':
    case 'ADD': {
      const { flags, rest: args } = takeFlags(file, line, keyword, rest);
      const parts = execForm(file, line, args) ?? splitWords(args, escape);
      if (parts.length < 2) fail(file, line, `${keyword} needs a source and a destination`);
      return {
        line,
        text,
        kind: keyword,
        sources: parts.slice(0, -1),
        destination: parts[parts.length - 1] ?? '',
        heredocs,
        flags,
      };
    }
    case 'ENV':
    case 'LABEL':
    case 'EXPOSE':
    case 'VOLUME':
    case 'HEALTHCHECK':
    case 'STOPSIGNAL':
    case 'ONBUILD':
    case 'MAINTAINER':
      return { line, text, kind: keyword, raw: rest };
    case 'WORKDIR':
      return { line, text, kind: 'WORKDIR', path: rest };
    case 'USER':
      return { line, text, kind: 'USER', user: rest };
    case 'SHELL': {
      const argv = execForm(file, line, rest);
      if (!argv) fail(file, line, 'SHELL takes the JSON form, e.g. SHELL ["/bin/bash", "-c"]');
      return { line, text, kind: 'SHELL', argv };
    }
    case 'CMD':
    case 'ENTRYPOINT': {
      const argv = execForm(file, line, rest);
      return {
        line,
        text,
        kind: keyword,
        command: argv ? { form: 'exec', argv } : { form: 'shell', text: rest },
      };
    }
  }
}

/**
 * Expands `$name`, `${name}`, `${name:-word}`, `${name:+word}` (and their forms without the
 * colon) from `vars`, as Docker does for the instructions it expands: single-quoted text and
 * escaped dollars (`\$`) are left as written.
 */
export function expandVariables(text: string, vars: Readonly<Record<string, string>>, escape = '\\'): string {
  let out = '';
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i] ?? '';
    if (c === escape && text[i + 1] === '$') {
      out += `${c}$`;
      i++;
      continue;
    }
    if (c === "'") quoted = !quoted;
    if (c !== '$' || quoted) {
      out += c;
      continue;
    }
    const braced = /^\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\}/.exec(text.slice(i));
    const plain = /^\$([A-Za-z_][A-Za-z0-9_]*)/.exec(text.slice(i));
    if (braced) {
      const [whole, name = '', op, word = ''] = braced;
      const value = vars[name];
      const set = op?.startsWith(':') ? value !== undefined && value !== '' : value !== undefined;
      out += op?.endsWith('-') ? (set ? value : word) : op?.endsWith('+') ? (set ? word : '') : (value ?? '');
      i += whole.length - 1;
    } else if (plain) {
      out += vars[plain[1] ?? ''] ?? '';
      i += plain[0].length - 1;
    } else {
      out += c;
    }
  }
  return out;
}

/** `KEY=value` pairs (or the legacy `KEY value`) of ENV or LABEL, after variables are expanded. */
export function keyValues(
  file: string,
  line: number,
  kind: 'ENV' | 'LABEL',
  text: string,
  escape = '\\',
): [string, string][] {
  const words = splitWords(text, escape);
  const first = words[0] ?? '';
  if (!first.includes('=')) {
    // the legacy form: one key, the rest of the line its value
    const value = text
      .trim()
      .slice(text.trim().indexOf(first) + first.length)
      .trim();
    if (kind === 'ENV' && !ENV_VAR_NAME.test(first))
      fail(file, line, `"${first}" is not a valid environment variable name`);
    return [[first, splitWords(value, escape).join(' ')]];
  }
  return words.map((word) => {
    const eq = word.indexOf('=');
    if (eq <= 0) fail(file, line, `${kind} needs KEY=value pairs, got "${word}"`);
    const key = word.slice(0, eq);
    if (kind === 'ENV' && !ENV_VAR_NAME.test(key))
      fail(file, line, `"${key}" is not a valid environment variable name`);
    return [key, word.slice(eq + 1)];
  });
}
