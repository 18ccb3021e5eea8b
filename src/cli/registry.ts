import { AUDIT_COMMAND, auditCommand } from './commands/audit.ts';
import { BENCH_COMMAND, benchCommand } from './commands/bench.ts';
import { CERTS_COMMAND, certsCommand } from './commands/certs.ts';
import { CHECK_COMMAND, checkCommand } from './commands/check.ts';
import { CONTROLLER_COMMAND, NODE_COMMAND, controllerCommand, nodeCommand } from './commands/cluster.ts';
import { CREATE_COMMAND, createCommand } from './commands/create.ts';
import { ENV_RM_COMMAND, envRemoveCommand } from './commands/env-rm.ts';
import { EXEC_COMMAND, execCommand } from './commands/exec.ts';
import { EVAL_COMMAND, evalCommand } from './commands/eval.ts';
import {
  ENV_LS_COMMAND,
  ENV_SHOW_COMMAND,
  LAYER_BUILD_COMMAND,
  LAYER_GC_COMMAND,
  LAYER_LS_COMMAND,
  LAYER_PULL_COMMAND,
  envListCommand,
  envShowCommand,
  layerBuildCommand,
  layerGcCommand,
  layerListCommand,
  layerPullCommand,
} from './commands/layers.ts';
import { MCP_COMMAND, mcpCommand } from './commands/mcp.ts';
import { NODE_DRAIN_COMMAND, NODE_UNDRAIN_COMMAND, nodeDrainCommand } from './commands/node-drain.ts';
import { PROXY_COMMAND, proxyCommand } from './commands/proxy.ts';
import { GC_COMMAND, KILL_COMMAND, PS_COMMAND, gcCommand, killCommand, psCommand } from './commands/ps.ts';
import { RUN_COMMAND, runCommand } from './commands/run.ts';
import { SETUP_COMMAND, setupCommand } from './commands/setup.ts';
import { twoColumns, type CommandSpec } from './command-spec.ts';

/** A command: its table (parser and help) and what runs it. */
export interface Command {
  readonly spec: CommandSpec;
  readonly run: (args: string[]) => Promise<number>;
}

/** Every command, in the order `sandgym --help` lists them. */
export const COMMANDS: readonly Command[] = [
  { spec: SETUP_COMMAND, run: setupCommand },
  { spec: RUN_COMMAND, run: runCommand },
  { spec: CREATE_COMMAND, run: createCommand },
  { spec: EXEC_COMMAND, run: execCommand },
  { spec: PS_COMMAND, run: psCommand },
  { spec: KILL_COMMAND, run: killCommand },
  { spec: GC_COMMAND, run: gcCommand },
  { spec: AUDIT_COMMAND, run: auditCommand },
  { spec: LAYER_BUILD_COMMAND, run: layerBuildCommand },
  { spec: LAYER_PULL_COMMAND, run: layerPullCommand },
  { spec: LAYER_LS_COMMAND, run: layerListCommand },
  { spec: LAYER_GC_COMMAND, run: layerGcCommand },
  { spec: ENV_LS_COMMAND, run: envListCommand },
  { spec: ENV_SHOW_COMMAND, run: envShowCommand },
  { spec: ENV_RM_COMMAND, run: envRemoveCommand },
  { spec: EVAL_COMMAND, run: evalCommand },
  { spec: CHECK_COMMAND, run: checkCommand },
  { spec: MCP_COMMAND, run: mcpCommand },
  { spec: PROXY_COMMAND, run: proxyCommand },
  { spec: BENCH_COMMAND, run: benchCommand },
  { spec: NODE_COMMAND, run: nodeCommand },
  { spec: NODE_DRAIN_COMMAND, run: (args) => nodeDrainCommand('drain', args) },
  { spec: NODE_UNDRAIN_COMMAND, run: (args) => nodeDrainCommand('undrain', args) },
  { spec: CONTROLLER_COMMAND, run: controllerCommand },
  { spec: CERTS_COMMAND, run: certsCommand },
];

/**
 * The command named by the first words of argv, and the arguments after its name: the longest
 * name that matches, so `node drain ...` is node drain and `node --listen ...` is node.
 */
export function findCommand(argv: readonly string[]): { command: Command; args: string[] } | undefined {
  let found: { command: Command; args: string[] } | undefined;
  for (const command of COMMANDS) {
    const words = command.spec.name.split(' ');
    const matches = words.every((word, i) => argv[i] === word);
    if (matches && (!found || words.length > found.command.spec.name.split(' ').length))
      found = { command, args: argv.slice(words.length) };
  }
  return found;
}

/** The commands whose name starts with `group` (`layer`, `env`): what `sandgym layer` lists. */
export function commandsOf(group: string): Command[] {
  return COMMANDS.filter((command) => command.spec.name.startsWith(`${group} `));
}

/** One line a command: `sandgym --help` and a group's list. */
function summaryLines(commands: readonly Command[]): string[] {
  return twoColumns(commands.map(({ spec }): [string, string] => [spec.name, spec.summary]));
}

/** `sandgym --help`: one line a command, from the same tables their own help comes from. */
export function topLevelHelp(): string {
  return [
    'usage: sandgym COMMAND [ARGS]',
    '       sandgym COMMAND --help    its usage and every option',
    "       sandgym --version         this package's version",
    '',
    'commands:',
    ...summaryLines(COMMANDS),
    '',
    'run, create, exec, mcp, ps, kill, gc, audit, eval and check work on the cluster at $SANDGYM_PLATFORM',
    '(grpc://HOST:PORT, with $SANDGYM_TOKEN, and $SANDGYM_TLS_CA, $SANDGYM_TLS_CERT, $SANDGYM_TLS_KEY',
    'for TLS) when it is set, else on this host.',
    '',
    'Exit codes: 0 success, 1 the command failed, 2 bad usage or input (an unknown id too),',
    "3 infrastructure failure; each command's are in the README.",
  ].join('\n');
}

/** `sandgym layer --help`: the group's commands. */
export function groupHelp(group: string): string {
  return [
    `usage: sandgym ${group} COMMAND [ARGS]   (sandgym ${group} COMMAND --help: its options)`,
    '',
    ...summaryLines(commandsOf(group)),
  ].join('\n');
}
