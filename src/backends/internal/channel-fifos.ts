import { closeSync, constants, openSync } from 'node:fs';
import { Socket } from 'node:net';
import { join } from 'node:path';
import { runProgram } from '../host/run-program.ts';

/** The two FIFOs of a durable sandbox's channel, in its folder on the node. */
export function channelFifos(dir: string): { requests: string; responses: string } {
  return { requests: join(dir, 'agent.requests'), responses: join(dir, 'agent.responses') };
}

/**
 * Opens one end of a FIFO as a non-blocking stream on the event loop (not the thread pool).
 * With O_NONBLOCK the open never waits, so the synchronous call is brief.
 */
export function openPipe(path: string, end: 'read' | 'write'): Socket {
  const flags = (end === 'read' ? constants.O_RDONLY : constants.O_WRONLY) | constants.O_NONBLOCK;
  // a raw descriptor, which the socket owns from here on and closes when destroyed
  const fd = openSync(path, flags);
  return new Socket({ fd, readable: end === 'read', writable: end === 'write' });
}

/** A durable channel: the node's ends as streams, the agent's ends as fds to hand to the launcher. */
export interface DurableChannel {
  requests: Socket;
  responses: Socket;
  /** fd 3 and fd 4 of the launcher; close them in this process once it is spawned. */
  agentEnds: [number, number];
  closeAgentEnds(): void;
}

/**
 * Creates the FIFO pair of a durable sandbox. Unlike the socketpair a spawn makes, a FIFO can be
 * opened again by path, so a node agent that restarts after a crash can reach the agent again.
 * Each end is opened separately (its own file description), so the agent's blocking mode and
 * the node's non-blocking mode do not affect each other.
 */
export async function createChannelFifos(dir: string): Promise<DurableChannel> {
  const fifos = channelFifos(dir);
  await runProgram('mkfifo', ['-m', '600', fifos.requests, fifos.responses]);
  // a FIFO opens for writing without waiting only once it has a reader: readers first
  const agentRequests = openSync(fifos.requests, constants.O_RDONLY | constants.O_NONBLOCK);
  const requests = openPipe(fifos.requests, 'write');
  const responses = openPipe(fifos.responses, 'read');
  const agentResponses = openSync(fifos.responses, constants.O_WRONLY);
  return {
    requests,
    responses,
    agentEnds: [agentRequests, agentResponses],
    closeAgentEnds() {
      closeSync(agentRequests);
      closeSync(agentResponses);
    },
  };
}
