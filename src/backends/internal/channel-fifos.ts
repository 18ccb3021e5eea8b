import { constants, openSync } from 'node:fs';
import { Socket } from 'node:net';
import { join } from 'node:path';

/**
 * The two FIFOs of a sandbox's channel, in its folder on the node (the host helper creates them,
 * see agent/helper.c). Unlike a socketpair, a FIFO can be opened again by path, so a node agent
 * that restarts after a crash can reach a durable sandbox's agent again.
 */
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
