#!/usr/bin/env -S MALLOC_MMAP_THRESHOLD_=32768 node
// The setting above makes glibc map the socket and HTTP/2 buffers of a large call (32 KiB and up)
// on their own, so their memory goes back to the system when the call ends; in its shared heap,
// between smaller allocations that stay, it would not (docs/cluster.md, "Memory").
import { asksForHelp, commandHelp } from './command-spec.ts';
import { EXIT, UsageError, describeFailure } from './exit-codes.ts';
import { commandsOf, findCommand, groupHelp, topLevelHelp } from './registry.ts';
import { SANDGYM_VERSION } from './version.ts';

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    // `sandgym help run` is `sandgym run --help`
    const asked = rest.length ? findCommand(rest) : undefined;
    console.log(asked ? commandHelp(asked.command.spec) : topLevelHelp());
    return name ? EXIT.ok : EXIT.usage;
  }
  if (name === '--version' || name === '-V' || name === 'version') {
    console.log(SANDGYM_VERSION);
    return EXIT.ok;
  }
  const found = findCommand(argv);
  if (found) {
    if (!asksForHelp(found.args)) return found.command.run(found.args);
    console.log(commandHelp(found.command.spec));
    return EXIT.ok;
  }
  if (commandsOf(name).length) {
    // a group (`layer`, `env`) without one of its commands
    if (asksForHelp(rest)) {
      console.log(groupHelp(name));
      return EXIT.ok;
    }
    const sub = rest[0];
    throw new UsageError(
      `sandgym ${name}: ${sub ? `unknown command "${sub}"` : 'give a command'}; one of ${commandsOf(name)
        .map((command) => command.spec.name)
        .join(', ')} (sandgym ${name} --help)`,
    );
  }
  throw new UsageError(`unknown command "${name}"; sandgym --help lists them`);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    const { code, message } = describeFailure(error);
    console.error(`sandgym: ${message}`);
    process.exitCode = code;
  },
);
