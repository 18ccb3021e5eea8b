/* global process, console */
// A TypeScript-client process for crash tests: attaches to a live sandbox and an episode, then
// takes the steps given as JSON arguments, printing each reply as a JSON line. Built code only
// (dist/), since it runs as its own node process that a test kills.
// usage: node step-client.mjs URL TOKEN SANDBOX_ID EPISODE_ID ACTION_JSON...
import { SandboxEnv } from '../../dist/src/env/index.js';
import { Platform } from '../../dist/src/platform/index.js';

const [url, token, sandboxId, episodeId, ...actions] = process.argv.slice(2);
const platform = await Platform.connect(url, { token });
const env = await SandboxEnv.attach(platform, await platform.attachSandbox(sandboxId), episodeId);
for (const action of actions) {
  const { info, observation } = await env.step(JSON.parse(action));
  console.log(JSON.stringify({ replayed: info.replayed, observation }));
}
await platform.close(); // the sandbox lives on: it is the test's
