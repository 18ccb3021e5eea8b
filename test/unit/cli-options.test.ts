import { describe, expect, it } from 'vitest';
import {
  JSON_OPTION,
  commandHelp,
  parseCommand,
  type CommandSpec,
  type OptionSpec,
} from '../../src/cli/command-spec.ts';
import { UsageError } from '../../src/cli/exit-codes.ts';
import { COMMANDS, findCommand, topLevelHelp } from '../../src/cli/registry.ts';

/** A value each option's parser takes: its range's low end for a number, a word for text. */
function sampleArgs(name: string, option: OptionSpec): string[] {
  if (option.type === 'boolean') return [`--${name}`];
  if (option.type === 'integer' || option.type === 'number') return [`--${name}`, String(option.range[0])];
  return [`--${name}`, 'value'];
}

const TABLE = {
  name: 'try',
  summary: 'a command for these tests',
  operands: 'THING...',
  operandChoices: ['alpha'],
  options: {
    'memory-mib': { type: 'integer', range: [16, 4096], description: 'memory' },
    ratio: { type: 'number', range: [0, 2], description: 'a ratio' },
    name: { type: 'string', description: 'a name' },
    verbose: { type: 'boolean', description: 'more' },
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

function usageErrorOf(args: string[]): string {
  try {
    parseCommand(TABLE, args);
  } catch (error) {
    expect(error).toBeInstanceOf(UsageError);
    return (error as Error).message;
  }
  throw new Error(`${args.join(' ')} parsed`);
}

describe('the command tables', () => {
  it('give each command help that names every option its parser accepts, and no other', () => {
    for (const { spec } of COMMANDS) {
      const help = commandHelp(spec);
      const named = new Set([...help.matchAll(/^ {2}(?:-h, )?(--[a-z-]+)/gm)].map((match) => match[1]));
      named.delete('--help');
      expect([...named].sort(), spec.name).toEqual(
        Object.keys(spec.options)
          .map((name) => `--${name}`)
          .sort(),
      );
      for (const [name, option] of Object.entries(spec.options)) {
        // every option of the table parses: the help cannot name one the parser refuses
        const operands = spec.operands && !spec.takesCommandLine ? ['x'] : [];
        expect(
          () => parseCommand(spec, [...sampleArgs(name, option), ...operands]),
          `${spec.name} --${name}`,
        ).not.toThrow();
      }
      expect(() => parseCommand(spec, ['--no-such-option']), spec.name).toThrow(
        new RegExp(`unknown option --no-such-option; see sandgym ${spec.name} --help`),
      );
    }
  });

  it('list every command in sandgym --help, one line each, and find each by its words', () => {
    const help = topLevelHelp();
    for (const { spec } of COMMANDS) {
      expect(help, spec.name).toMatch(
        new RegExp(`^ {2}${spec.name} +${spec.summary.slice(0, 20).replace(/[$()]/g, '\\$&')}`, 'm'),
      );
      expect(findCommand([...spec.name.split(' '), '--x'])?.command.spec.name).toBe(spec.name);
    }
    expect(findCommand(['node', '--listen', ':0'])?.command.spec.name).toBe('node');
    expect(findCommand(['layer'])).toBeUndefined();
  });

  it('refuse a number out of range, a fraction, a word or a negative, naming the flag and the range', () => {
    expect(usageErrorOf(['--memory-mib', '99999999'])).toBe(
      '--memory-mib must be a whole number from 16 to 4096, got 99999999',
    );
    expect(usageErrorOf(['--memory-mib', '-5'])).toBe(
      '--memory-mib must be a whole number from 16 to 4096, got -5',
    );
    expect(usageErrorOf(['--memory-mib=-5'])).toBe(
      '--memory-mib must be a whole number from 16 to 4096, got -5',
    );
    expect(usageErrorOf(['--memory-mib', '64.5'])).toMatch(/whole number .* got 64.5/);
    expect(usageErrorOf(['--memory-mib', 'lots'])).toMatch(/--memory-mib must be .* got lots/);
    expect(usageErrorOf(['--memory-mib', ''])).toMatch(/got nothing/);
    expect(usageErrorOf(['--ratio', '2.5'])).toBe('--ratio must be a number from 0 to 2, got 2.5');
    expect(parseCommand(TABLE, ['--ratio', '0.5', '--memory-mib', '16']).values).toMatchObject({
      ratio: 0.5,
      'memory-mib': 16,
    });
  });

  it("put parseArgs' errors in the command's words", () => {
    expect(usageErrorOf(['--name'])).toBe('sandgym try: --name needs a value; see sandgym try --help');
    expect(usageErrorOf(['--name', '-x'])).toMatch(
      /--name needs a value; one that starts with "-" goes as --name=VALUE/,
    );
    expect(usageErrorOf(['--verbose=yes'])).toBe(
      'sandgym try: --verbose takes no value; see sandgym try --help',
    );
    expect(() => parseCommand({ name: 'bare', summary: 'no operands', options: {} }, ['stray'])).toThrow(
      /takes no arguments but options, got "stray"/,
    );
  });

  it('read --json [OUT] one way: stdout alone or with -, else the word after it, unless that is an option or an operand word', () => {
    const json = (args: string[]) => parseCommand(TABLE, args);
    expect(json(['a', '--json']).values['json']).toBe('-');
    expect(json(['a', '--json', '-']).values['json']).toBe('-');
    expect(json(['a', '--json', '--verbose']).values).toMatchObject({ json: '-', verbose: true });
    expect(json(['a', '--json', 'out.json'])).toMatchObject({
      values: { json: 'out.json' },
      positionals: ['a'],
    });
    expect(json(['a', '--json=out.json']).values['json']).toBe('out.json');
    expect(json(['--json', 'alpha'])).toMatchObject({ values: { json: '-' }, positionals: ['alpha'] });
    expect(json(['a']).values['json']).toBeUndefined();
  });
});
