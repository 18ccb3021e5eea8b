import { NODE, WireClient } from '../../platform/index.ts';
import { flag, jsonOutput, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { CLUSTER_SERVER_OPTIONS, clientTls, nodeToken } from './cluster-options.ts';

const UNDRAIN_OPTIONS = {
  node: { type: 'string', value: 'HOST:PORT', description: "the node agent's address" },
  'node-token-file': CLUSTER_SERVER_OPTIONS['node-token-file'],
  ...JSON_OPTION,
} as const;

export const NODE_UNDRAIN_COMMAND = {
  name: 'node undrain',
  summary: 'let a drained node take new sandboxes again',
  options: UNDRAIN_OPTIONS,
} as const satisfies CommandSpec;

/** `sandgym node drain` (a Kubernetes preStop hook runs it). */
export const NODE_DRAIN_COMMAND = {
  name: 'node drain',
  summary: 'stop placement on a node; wait until its sandboxes ended or hibernated',
  details: 'Progress goes to stderr; over TLS when $SANDGYM_TLS_CA is set.',
  options: {
    ...UNDRAIN_OPTIONS,
    'hibernate-idle': { type: 'boolean', description: 'hibernate idle sandboxes rather than wait for them' },
  },
} as const satisfies CommandSpec;

/**
 * `sandgym node drain --node HOST:PORT [--hibernate-idle]`: stops placement on a node and waits,
 * reporting on stderr, until none of its sandboxes is left running (each ended or hibernated).
 * `sandgym node undrain --node HOST:PORT` takes new sandboxes again. Both speak to the node agent
 * with the node token, over TLS when $SANDGYM_TLS_CA is set.
 */
export async function nodeDrainCommand(verb: 'drain' | 'undrain', args: string[]): Promise<number> {
  const parsed = parseCommand(verb === 'drain' ? NODE_DRAIN_COMMAND : NODE_UNDRAIN_COMMAND, args);
  const address = text(parsed, 'node');
  if (!address)
    throw new UsageError(`sandgym node ${verb}: give --node HOST:PORT (the node agent's address)`);
  const json = await jsonOutput(parsed);
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
      console.error(`sandgym node undrain: ${address} (node ${status.nodeId}) takes new sandboxes`);
      await json?.write({ node: status.nodeId, draining: status.draining });
      return EXIT.ok;
    }
    let last = { remaining: 0, hibernated: 0 };
    for await (const progress of client.stream('Drain', {
      hibernateIdle: flag(parsed, 'hibernate-idle'),
    })) {
      last = progress;
      if (progress.remaining > 0) {
        console.error(
          `sandgym node drain: ${progress.remaining} still running (${progress.waitingFor.join(', ')}${progress.remaining > progress.waitingFor.length ? ', ...' : ''}), ${progress.hibernated} hibernated`,
        );
      }
    }
    console.error(`sandgym node drain: ${address} is drained; ${last.hibernated} sandboxes hibernated there`);
    await json?.write({ node: address, drained: true, hibernated: last.hibernated });
    return EXIT.ok;
  } finally {
    client.close();
  }
}
