// The holder of one sandbox that `sandgym create` leaves behind (see held-sandboxes.ts): started
// detached with the sandbox request as its one argument, it answers one JSON line on stdout, then
// serves the sandbox until it ends.
import { randomBytes } from 'node:crypto';
import { processIdentity } from '../backends/index.ts';
import { SandgymError, isSandgymError, messageOf, silentLogger } from '../common/index.ts';
import {
  NodeAgent,
  Platform,
  defaultProject,
  type LocalPlatform,
  type Sandbox,
  type SandboxRequest,
} from '../platform/index.ts';
import { removeHolderRecord, writeHolderRecord, type HolderReply } from './held-sandboxes.ts';

/** How often the holder checks that its sandbox is still there (a kill from outside removes it). */
const WATCH_MS = 1_000;

function answer(reply: HolderReply): Promise<void> {
  return new Promise((resolve, reject) => {
    process.stdout.write(`${JSON.stringify(reply)}\n`, (error) => (error ? reject(error) : resolve()));
  });
}

/** Serves the sandbox until it ends, then closes everything; resolves when it has. */
async function hold(platform: LocalPlatform, request: SandboxRequest): Promise<void> {
  const identity = await processIdentity(process.pid);
  if (!identity) throw new SandgymError('platform_error', "Cannot read this process's identity from /proc");
  // what other processes present to reach the sandbox; in a record only root may read
  const token = randomBytes(32).toString('hex');
  const agent = await NodeAgent.start(platform, {
    listen: '127.0.0.1:0',
    token,
    logger: silentLogger(),
  }).catch(async (error: unknown) => {
    await platform.close();
    throw error;
  });
  try {
    const sandbox = await agent.clientFor(defaultProject()).createSandbox(request);
    await writeHolderRecord(platform.dataDir, {
      owner: identity,
      sandbox: sandbox.id,
      port: agent.port,
      token,
    });
    await answer({
      sandbox: {
        id: sandbox.id,
        backend: sandbox.backend,
        ...(sandbox.labels['environment'] ? { environment: sandbox.labels['environment'] } : {}),
        ownerPid: process.pid,
      },
    });
    // no one reads it any more: a write would fail with EPIPE
    process.stdout.destroy();
    await endOf(platform, sandbox);
  } finally {
    await removeHolderRecord(platform.dataDir, process.pid);
    // destroys the sandbox (if a signal, not its end, brought us here) and the platform
    await agent.close();
  }
}

/** Resolves once the sandbox stopped, failed or was removed from outside, or a signal came. */
function endOf(platform: LocalPlatform, sandbox: Sandbox): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      clearInterval(watch);
      process.off('SIGTERM', done);
      process.off('SIGINT', done);
      process.off('SIGHUP', done);
      resolve();
    };
    const watch = setInterval(() => {
      if (sandbox.state === 'stopped' || sandbox.state === 'failed') return done();
      void platform.listSandboxes().then(
        (records) => {
          if (!records.some((record) => record.id === sandbox.id)) done();
        },
        () => undefined,
      );
    }, WATCH_MS);
    process.on('SIGTERM', done);
    process.on('SIGINT', done);
    process.on('SIGHUP', done);
  });
}

async function main(): Promise<void> {
  let platform: LocalPlatform | undefined;
  try {
    const request = JSON.parse(process.argv[2] ?? '{}') as SandboxRequest;
    platform = await Platform.local();
    await hold(platform, request);
  } catch (error) {
    const code = isSandgymError(error) ? error.code : 'platform_error';
    await answer({ error: { code, message: messageOf(error) } }).catch(() => undefined);
    process.exitCode = 1;
  }
}

void main();
