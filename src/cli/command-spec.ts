import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError } from './exit-codes.ts';

/** A text option, or a flag. */
interface PlainOption {
  readonly type: 'string' | 'boolean';
  readonly default?: string | boolean;
}

/** A number option: its value is checked against `range`, both ends included, as it is parsed. */
interface NumberOption {
  /** integer: a whole number; number: any decimal. */
  readonly type: 'integer' | 'number';
  readonly range: readonly [min: number, max: number];
  readonly default?: number;
}

/**
 * One option of a command. The parser's configuration and the help text are both made from it,
 * so the options a command takes and the ones its help names cannot drift apart.
 */
export type OptionSpec = (PlainOption | NumberOption) & {
  /** One line (or a few words) for the help text. */
  readonly description: string;
  /** The value's name in the help text (`--out DIR`); N for numbers, VALUE for text without it. */
  readonly value?: string;
  /** The option may be given again (`--build-arg A=1 --build-arg B=2`). */
  readonly multiple?: boolean;
  /** The value may be left out: `--json` alone is `--json -` (see JSON_OPTION). */
  readonly optionalValue?: boolean;
};

export type OptionTable = Readonly<Record<string, OptionSpec>>;

/** A command: what `sandgym --help` lists in one line, and what `sandgym NAME --help` prints. */
export interface CommandSpec {
  /** The words that name it: `run`, `layer build`. */
  readonly name: string;
  /** One line for `sandgym --help`. */
  readonly summary: string;
  /** What follows the options in the usage line: `TASK...`, `ID ...`, `-- CMD ...`. */
  readonly operands?: string;
  /** Operands that are words from a fixed set: `--json NAME` leaves such a NAME an operand. */
  readonly operandChoices?: readonly string[];
  /** Arguments after `--` are a command line for it, not its own (`sandgym run -- CMD`). */
  readonly takesCommandLine?: boolean;
  /** More lines for its own help: what it does, where it works, what it prints. */
  readonly details?: string;
  readonly options: OptionTable;
}

/** The value of an option: text, a flag, a number, or every value of a repeatable option. */
type OptionValue = string | boolean | number | string[] | undefined;

/** A command's parsed arguments: numbers checked and converted, defaults filled in. */
export interface ParsedCommandArgs {
  values: Record<string, OptionValue>;
  positionals: string[];
  /** What followed `--`, for a command that takes a command line. */
  commandLine: string[];
}

/** `--json [OUT]`, the same on every command that can print JSON. */
export const JSON_OPTION = {
  json: {
    type: 'string',
    value: 'OUT',
    optionalValue: true,
    description: 'one JSON document instead of text, on stdout; with OUT (other than -) in that file',
  },
} as const satisfies OptionTable;

/** The words that ask for help; `sandgym COMMAND --help` prints its usage and exits 0. */
const HELP_FLAGS: readonly string[] = ['--help', '-h'];

/** Whether a command's arguments ask for its help (not counting a command line after `--`). */
export function asksForHelp(args: readonly string[]): boolean {
  const end = args.indexOf('--');
  return (end < 0 ? args : args.slice(0, end)).some((arg) => HELP_FLAGS.includes(arg));
}

/** Splits arguments at the first "--": options before it, a command after it. */
function splitAtDoubleDash(args: string[]): { before: string[]; after: string[] } {
  const at = args.indexOf('--');
  return at < 0 ? { before: args, after: [] } : { before: args.slice(0, at), after: args.slice(at + 1) };
}

/** The node:util parseArgs configuration a table makes: numbers are read as text, then checked. */
function parserOptions(table: OptionTable): NonNullable<ParseArgsConfig['options']> {
  return Object.fromEntries(
    Object.entries(table).map(([name, option]) => [
      name,
      {
        type: option.type === 'boolean' ? 'boolean' : 'string',
        ...(option.multiple ? { multiple: true } : {}),
      },
    ]),
  );
}

const NUMBER_LIKE = /^-\.?\d/;

/**
 * Rewrites `--name VALUE` to `--name=VALUE` where parseArgs would misread it: a negative number
 * (which it calls "ambiguous"), and an option whose value may be left out (`--json` then stands
 * alone, as `--json=-`: stdout). A following word is an optional value unless it looks like an
 * option or is one of the command's operand words.
 */
function attachValues(spec: CommandSpec, args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    const option = arg.startsWith('--') && !arg.includes('=') ? spec.options[arg.slice(2)] : undefined;
    const next = args[i + 1];
    if (option?.optionalValue) {
      const takesNext =
        next !== undefined &&
        (next === '-' || (!next.startsWith('-') && !(spec.operandChoices ?? []).includes(next)));
      out.push(`${arg}=${takesNext ? next : '-'}`);
      if (takesNext) i++;
    } else if (option && option.type !== 'boolean' && next !== undefined && NUMBER_LIKE.test(next)) {
      out.push(`${arg}=${next}`);
      i++;
    } else out.push(arg);
  }
  return out;
}

/** parseArgs' message, in the command's words and pointing at its help. */
function usageMessage(spec: CommandSpec, error: Error & { code?: string }): string {
  const quoted = /'(-[^' ]+)/.exec(error.message)?.[1];
  const help = `see sandgym ${spec.name} --help`;
  if (error.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION')
    return `sandgym ${spec.name}: unknown option ${quoted ?? error.message}; ${help}`;
  if (/ambiguous/.test(error.message))
    return `sandgym ${spec.name}: ${quoted ?? 'an option'} needs a value; one that starts with "-" goes as ${quoted ?? '--NAME'}=VALUE`;
  if (/does not take an argument/.test(error.message))
    return `sandgym ${spec.name}: ${quoted ?? 'a flag'} takes no value; ${help}`;
  if (/argument missing/.test(error.message))
    return `sandgym ${spec.name}: ${quoted ?? 'an option'} needs a value; ${help}`;
  return `sandgym ${spec.name}: ${error.message}; ${help}`;
}

/** A number option's value, or a usage error naming the flag and its range. */
function checkedNumber(name: string, option: NumberOption, given: string): number {
  const [min, max] = option.range;
  const whole = option.type === 'integer';
  const n = /^\s*-?(\d+\.?\d*|\.\d+)\s*$/.test(given) ? Number(given) : NaN;
  if (!(n >= min && n <= max) || (whole && !Number.isInteger(n))) {
    throw new UsageError(
      `--${name} must be ${whole ? 'a whole number' : 'a number'} from ${min} to ${max}, got ${given === '' ? 'nothing' : given}`,
    );
  }
  return n;
}

/**
 * Parses a command's arguments by its table, strictly: an unknown option, a missing value or a
 * number out of range is a usage error naming the flag, before the command does any work.
 */
export function parseCommand(spec: CommandSpec, args: string[]): ParsedCommandArgs {
  const { before, after } = spec.takesCommandLine ? splitAtDoubleDash(args) : { before: args, after: [] };
  let parsed: {
    values: Record<string, string | boolean | (string | boolean)[] | undefined>;
    positionals: string[];
  };
  try {
    parsed = parseArgs({
      args: attachValues(spec, before),
      options: parserOptions(spec.options),
      strict: true,
      allowPositionals: true,
    });
  } catch (error) {
    throw new UsageError(usageMessage(spec, error as Error));
  }
  const values: Record<string, OptionValue> = {};
  for (const [name, option] of Object.entries(spec.options)) {
    const given = parsed.values[name];
    if (given === undefined) values[name] = option.default;
    else if (option.type === 'integer' || option.type === 'number')
      values[name] = checkedNumber(name, option, String(Array.isArray(given) ? given.at(-1) : given));
    else values[name] = Array.isArray(given) ? given.map(String) : given;
  }
  if (!spec.operands && parsed.positionals.length)
    throw new UsageError(
      `sandgym ${spec.name}: takes no arguments but options, got "${parsed.positionals[0]}"; see sandgym ${spec.name} --help`,
    );
  return { values, positionals: parsed.positionals, commandLine: after };
}

/** The left column of an option's help line: `--memory-mib N`, `--json [OUT]`. */
function optionSignature(name: string, option: OptionSpec): string {
  if (option.type === 'boolean') return `--${name}`;
  const value = option.value ?? (option.type === 'string' ? 'VALUE' : 'N');
  return option.optionalValue ? `--${name} [${value}]` : `--${name} ${value}`;
}

/** An option's description with its range, default, and whether it repeats, in one parenthesis. */
function describedOption(option: OptionSpec): string {
  const notes = [
    option.type === 'integer' || option.type === 'number'
      ? `${option.type === 'integer' ? 'a whole number' : 'a number'} from ${option.range[0]} to ${option.range[1]}`
      : '',
    option.default === undefined || option.default === false ? '' : `default ${String(option.default)}`,
    option.multiple ? 'repeatable' : '',
  ].filter(Boolean);
  if (!notes.length) return option.description;
  // a description that ends in a parenthesis of its own takes the notes into it
  return option.description.endsWith(')')
    ? `${option.description.slice(0, -1)}; ${notes.join('; ')})`
    : `${option.description} (${notes.join('; ')})`;
}

/** The width help text is wrapped to: a terminal's, less a margin. */
const HELP_WIDTH = 100;

/** Words joined into lines of at most `width` characters (a longer word gets a line of its own). */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  for (const word of text.split(' ')) {
    const last = lines.at(-1);
    if (last !== undefined && last.length + 1 + word.length <= width)
      lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  return lines;
}

/**
 * Lines of two columns: names padded to one width, their text wrapped beside them; a name too
 * long for the column has its text start on the next line.
 */
export function twoColumns(rows: [string, string][], indent = 2): string[] {
  const width = Math.min(28, Math.max(...rows.map(([left]) => left.length)));
  const pad = ' '.repeat(indent);
  const hanging = ' '.repeat(indent + width + 2);
  return rows.flatMap(([left, right]) => {
    const [first = '', ...more] = wrap(right, Math.max(30, HELP_WIDTH - hanging.length));
    const head =
      left.length > width
        ? [`${pad}${left}`, `${hanging}${first}`]
        : [`${pad}${left.padEnd(width)}  ${first}`];
    return [...head, ...more.map((line) => `${hanging}${line}`)];
  });
}

/** A command's usage line. */
function usageLine(spec: CommandSpec): string {
  const options = Object.keys(spec.options).length ? ' [OPTIONS]' : '';
  return `usage: sandgym ${spec.name}${options}${spec.operands ? ` ${spec.operands}` : ''}`;
}

/** `sandgym COMMAND --help`: its usage, what it does, and every option of its table. */
export function commandHelp(spec: CommandSpec): string {
  const rows = Object.entries(spec.options).map(([name, option]): [string, string] => [
    optionSignature(name, option),
    describedOption(option),
  ]);
  rows.push(['-h, --help', 'this help']);
  return [
    usageLine(spec),
    '',
    spec.summary,
    ...(spec.details ? ['', spec.details] : []),
    '',
    'options:',
    ...twoColumns(rows),
  ].join('\n');
}
