#!/usr/bin/env -S MALLOC_MMAP_THRESHOLD_=32768 node
// The setting above makes glibc map the socket and HTTP/2 buffers of a large call (32 KiB and up)
// on their own, so their memory goes back to the system when the call ends; in its shared heap,
// between smaller allocations that stay, it would not (docs/cluster.md, "Memory").
import { auditCommand } from './commands/audit.ts';
import { benchCommand } from './commands/bench.ts';
import { checkCommand } from './commands/check.ts';
import { controllerCommand, nodeCommand } from './commands/cluster.ts';
import { certsCommand } from './commands/certs.ts';
import { evalCommand } from './commands/eval.ts';
import { envCommand, layerCommand } from './commands/layers.ts';
import { mcpCommand } from './commands/mcp.ts';
import { proxyCommand } from './commands/proxy.ts';
import { gcCommand, killCommand, psCommand } from './commands/ps.ts';
import { runCommand } from './commands/run.ts';
import { setupCommand } from './commands/setup.ts';
import { EXIT, UsageError, describeFailure } from './exit-codes.ts';
import { SANDGYM_VERSION } from './version.ts';

const USAGE = `usage: sandgym COMMAND [ARGS]   (sandgym --version: this package's version)

  setup [--swap-mib N] [--no-criu] [--no-swap]
                                          prepare this host: Debian packages, kernel checks, base layers,
                                          and memory checkpoints: CRIU 4.1 (built once), else a swap file
  run [--backend B] [--env E] [--json] [--timeout-ms N] [--memory-mib N] [--load-mode ondemand|eager|tar] -- CMD ...
                                          one sandbox, one command: output, exit code, teardown
  layer build (--from-dir D | --from-tar T | --from-oci A) [--name NAME:VERSION] [--base ENV]
                                          a folder, tar(.gz) or OCI image (docker save / OCI layout)
                                          as an EROFS layer, and optionally an environment
  layer build --from-sandbox ID --name NAME:VERSION
                                          pack_diff: a live sandbox's changes over its own stack
  layer build --dockerfile F [--context C] --name NAME:VERSION [--build-arg K=V] [--target STAGE]
       [--build-net RULE|none] [--fallback-base ENV] [--registry-auth FILE] [--insecure-registry HOST]
                                          the Dockerfile reference, RUN in our own containers reaching the
                                          node's package mirrors, FROM from the store or pulled, cached
  layer pull IMAGE [--registry-auth FILE] [--insecure-registry HOST] [--json]
                                          an image from its OCI registry into the store, by digest
  layer ls [--json]                       stored layers
  layer gc [--min-age-minutes N] [--json] unused mounts, node copies and unreferenced layers (default age 60)
  env ls [--json] | env show NAME:VERSION environments: layer stacks plus config
  eval TASK... [--agent oracle|nop|openai:MODEL|MODULE.js] [--base-url URL] [--concurrency N] [--max-steps N]
       [--temperature T] [--max-tokens N] [--system-prompt TEXT] [--token-ids]
       [--json OUT] [--report OUT.html] [--atif DIR] [--run NAME [--lease 30s]] [--decision-timeout 30m]
       [--fallback-base ENV] [--registry-auth FILE] [--insecure-registry HOST] [--task-env VAR]
                                          run Harbor, Terminal-Bench or SWE-bench tasks, grade each in a
                                          fresh sandbox; openai:MODEL drives an OpenAI-compatible endpoint
                                          at --base-url (key in $SANDGYM_LLM_API_KEY or $OPENAI_API_KEY);
                                          --token-ids asks it for token ids and logprobs (vLLM);
                                          --atif writes one ATIF trajectory per episode; --run puts the
                                          sandboxes in a training run, whose lease it renews: killed, they
                                          hibernate, and a rerun with the same --run resumes them
  mcp [--environment ENV | --sandbox ID] [--user USER]
                                          a sandbox's actions (exec, write_file, read_file, list_dir) as
                                          MCP tools over stdio, as USER (default the environment's USER);
                                          a sandbox it made goes when the client does
  proxy --upstream URL --out DIR [--listen 127.0.0.1:PORT] [--timeout 10m]
                                          an OpenAI-compatible recording proxy for agents with their own
                                          loop: each chat completion (streamed or not) passes through and
                                          is appended to DIR/turns.jsonl with its token ids and logprobs;
                                          loopback only; upstream key in $SANDGYM_LLM_API_KEY
  check TASK... [--json] [--fallback-base ENV] [--task-env VAR]
                                          the agentic env checker: oracle passes, nop fails, no leaks,
                                          deterministic reset, replay matches, clean close
  ps [--json]                             live sandboxes on this node
  kill ID ...                             destroy sandboxes, whichever process owns them
  gc [--json]                             reap what crashed owners left behind
  audit ID [--json]                       a sandbox's signals (denied egress, protected paths changed,
                                          limits hit, processes left running) and its command history
  bench [NAME ...] [--json [OUT]]         benchmarks beside their baselines (create, exec);
                                          cluster-scale takes --nodes N --creates N --in-flight N,N ...
  node --listen ADDR [--data-dir D] [--store S] [--node-id ID] [--max-sandboxes N] [--memory-mib N]
       [--overcommit X] [--free-floor-mib N] [--warm-pool N] [--warm-pool-best-effort N]
       [--net-rules FILE]   (JSON: {"mirror:debian": ["IP[/N][:PORT]", ...]}; or $SANDGYM_NET_RULES)
       [--control-plane IP[/N][:PORT],:PORT,...]  (controllers etc.: no sandbox rule ever reaches them)
       [--task-root DIR]    (tasks the Envs service may serve, by path under DIR)
       [--trajectory-retention 7d]  (how long an ended sandbox's step log stays for audit)
       [--max-in-flight-mib 256] [--max-in-flight-total-mib N]  (request bodies held per project, all)
       [--max-store-mib 16384]  (what each project may hold in the layer store)
       [--etcd URL,... [--advertise HOST:PORT] [--lease-ttl 10s]]  (join through etcd)
       [--tls-ca F --tls-cert F --tls-key F]  (mutual TLS)
       [--metrics-listen [HOST:]PORT [--metrics-token-file F]]  (loopback unless HOST; off it, a token)
       [--log-level debug|info|warn|error|silent]
                                          a node agent (cluster mode); token in $SANDGYM_NODE_TOKEN
                                          or --node-token-file; logs JSON lines on stderr
  node drain --node HOST:PORT [--hibernate-idle]
                                          stop placement on a node; wait until its sandboxes ended or
                                          hibernated (node undrain --node HOST:PORT takes it back)
  controller --listen ADDR (--nodes ADDR,... | --etcd URL,...) --grants FILE [--poll-ms N]
       [--queue-timeout-ms N] [--tls-ca F --tls-cert F --tls-key F]
       [--metrics-listen [HOST:]PORT [--metrics-token-file F]] [--log-level LEVEL]
                                          a controller replica (cluster mode); grants: tokens to
                                          {project, maxSandboxes, network: [rules it may use],
                                          maxInFlightBytes?, maxStoreBytes?}
  certs --out DIR [--hosts localhost,127.0.0.1,...] [--days 365]
                                          a development CA and certificates, made with openssl

run, ps, kill, gc, audit, eval and check work on the cluster at $SANDGYM_PLATFORM (grpc://HOST:PORT, with $SANDGYM_TOKEN,
and $SANDGYM_TLS_CA, $SANDGYM_TLS_CERT, $SANDGYM_TLS_KEY for TLS) when it is set, else on this host.

Exit codes: 0 success, 1 the command failed, 2 bad usage or input, 3 infrastructure failure.`;

const COMMANDS: Record<string, (args: string[]) => Promise<number>> = {
  setup: setupCommand,
  run: runCommand,
  ps: psCommand,
  kill: killCommand,
  gc: gcCommand,
  audit: auditCommand,
  bench: benchCommand,
  layer: layerCommand,
  env: envCommand,
  eval: evalCommand,
  check: checkCommand,
  node: nodeCommand,
  controller: controllerCommand,
  certs: certsCommand,
  mcp: mcpCommand,
  proxy: proxyCommand,
};

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    console.log(USAGE);
    return name ? EXIT.ok : EXIT.usage;
  }
  if (name === '--version' || name === '-V' || name === 'version') {
    console.log(SANDGYM_VERSION);
    return EXIT.ok;
  }
  const command = COMMANDS[name];
  if (!command) throw new UsageError(`unknown command "${name}"; run sandgym --help`);
  return command(args);
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
