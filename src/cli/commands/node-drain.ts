import { NODE, WireClient } from '../../platform/index.ts';
import { parseCommandArgs, text } from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { clientTls, nodeToken } from './cluster-options.ts';

const UNDRAIN_OPTIONS = {
  node: { type: 'string' },
  'node-token-file': { type: 'string' },
} as const;

/** The options of `sandgym node drain` (a Kubernetes preStop hook runs it). */
export const DRAIN_OPTIONS = { ...UNDRAIN_OPTIONS, 'hibernate-idle': { type: 'boolean' } } as const;

/**
 * `sandgym node drain --node HOST:PORT [--hibernate-idle]`: stops placement on a node and waits,
 * reporting on stderr, until none of its sandboxes is left running (each ended or hibernated).
 * `sandgym node undrain --node HOST:PORT` takes new sandboxes again. Both speak to the node agent
 * with the node token, over TLS when $SANDGYM_TLS_CA is set.
 */
export async function nodeDrainCommand(verb: 'drain' | 'undrain', args: string[]): Promise<number> {
  const parsed = parseCommandArgs(`node ${verb}`, args, verb === 'drain' ? DRAIN_OPTIONS : UNDRAIN_OPTIONS);
  const address = text(parsed, 'node');
  if (!address)
    throw new UsageError(`sandgym node ${verb}: give --node HOST:PORT (the node agent's address)`);
  const tls = await clientTls();
  const client = new WireClient(address, NODE, {
    token: await nodeToken(`node ${verb}`, text(parsed, 'node-token-file')),
    unreachable: 'node_lost',
    ...(tls ? { tls } : {}),
  });
  try {
    await client.waitForReady(10_000);
    if (verb === 'undrain') {
      const status = await client.call('Undrain', {});
      console.log(JSON.stringify({ node: status.nodeId, draining: status.draining }));
      return EXIT.ok;
    }
    let last = { remaining: 0, hibernated: 0 };
    for await (const progress of client.stream('Drain', {
      hibernateIdle: parsed.values['hibernate-idle'] === true,
    })) {
      last = progress;
      if (progress.remaining > 0) {
        console.error(
          `sandgym node drain: ${progress.remaining} still running (${progress.waitingFor.join(', ')}${progress.remaining > progress.waitingFor.length ? ', ...' : ''}), ${progress.hibernated} hibernated`,
        );
      }
    }
    console.error(`sandgym node drain: ${address} is drained; ${last.hibernated} sandboxes hibernated there`);
    console.log(JSON.stringify({ node: address, drained: true, hibernated: last.hibernated }));
    return EXIT.ok;
  } finally {
    client.close();
  }
}
