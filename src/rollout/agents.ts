import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { SandgymError } from '../common/index.ts';
import { oraclePlan, type SandboxAction } from '../env/index.ts';
import type { Agent } from './agent-types.ts';
import { openAiAgent, type OpenAiAgentOptions } from './llm-agent.ts';

export type { Agent, AgentContext, AgentDecision } from './agent-types.ts';
export { AgentError, decisionOf } from './agent-types.ts';

/**
 * The oracle: takes the task's {@link oraclePlan} (its solution, run as the task's agent user, as
 * any agent's actions are), then submits.
 */
export function oracleAgent(): Agent {
  let plan: SandboxAction[] | undefined;
  const oracle: Agent = (_observation, { task, stepIndex }) => {
    plan ??= oraclePlan(task);
    return Promise.resolve(plan[stepIndex] ?? { type: 'submit' });
  };
  return Object.assign(oracle, { isOracle: true });
}

/** The do-nothing agent: submits at once. A task it passes is broken. */
export function nopAgent(): Agent {
  return () => Promise.resolve({ type: 'submit' });
}

/** An agent that plays a fixed list of actions, then submits: for scripted tests and cheats. */
export function scriptedAgent(actions: SandboxAction[]): Agent {
  return (_observation, { stepIndex }) => Promise.resolve(actions[stepIndex] ?? { type: 'submit' });
}

/**
 * An agent `--agent` names, and what it is. The identity keys an eval's resume journal, so
 * another agent, the same module edited, or the same model behind another endpoint or with other
 * options never takes up an earlier run's results. It never holds the API key.
 */
export interface ResolvedAgent {
  makeAgent: () => Agent;
  identity: string;
}

/**
 * An agent by name (oracle, nop), `openai:MODEL`, or from a module whose default export makes one
 * (`export default () => agent`), as `sandgym eval --agent ./my-agent.js` takes it.
 */
export async function resolveAgent(nameOrModule: string, model: ModelEndpoint = {}): Promise<ResolvedAgent> {
  const builtIn = BUILT_IN_AGENTS[nameOrModule];
  if (builtIn) return { makeAgent: builtIn, identity: JSON.stringify({ builtIn: nameOrModule }) };
  const name = modelOfAgent(nameOrModule);
  if (name !== undefined) {
    if (!name) throw new SandgymError('invalid_argument', '--agent openai:MODEL needs a model name');
    if (!model.baseUrl)
      throw new SandgymError(
        'invalid_argument',
        `--agent ${nameOrModule} needs --base-url, the API root of an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1)`,
      );
    const { apiKey, ...endpoint } = model;
    const options: OpenAiAgentOptions = { model: name, baseUrl: model.baseUrl, ...endpoint };
    return {
      makeAgent: openAiAgent({ ...options, ...(apiKey ? { apiKey } : {}) }),
      identity: JSON.stringify({ openai: options }),
    };
  }
  if (!/[./]/.test(nameOrModule)) {
    throw new SandgymError(
      'invalid_argument',
      `--agent must be one of ${Object.keys(BUILT_IN_AGENTS).join(', ')}, openai:MODEL or a module path; got "${nameOrModule}"`,
    );
  }
  const path = resolve(nameOrModule);
  let loaded: { default?: unknown };
  let content: Buffer;
  try {
    content = await readFile(path);
    loaded = (await import(pathToFileURL(path).href)) as { default?: unknown };
  } catch (error) {
    throw new SandgymError(
      'invalid_argument',
      `Cannot load the agent module ${nameOrModule}: ${(error as Error).message}`,
      { cause: error },
    );
  }
  if (typeof loaded.default !== 'function') {
    throw new SandgymError(
      'invalid_argument',
      `The agent module ${nameOrModule} must export a default function that returns an agent`,
    );
  }
  return {
    makeAgent: loaded.default as () => Agent,
    identity: JSON.stringify({ module: path, sha256: await moduleTreeHash(path, content) }),
  };
}

/** `import ... from 'x'`, `export ... from 'x'`, `import 'x'`, `import('x')`, `require('x')`. */
const IMPORT_SPECIFIERS =
  /\b(?:from\s*|import\s*\(?\s*|require\s*\(\s*)(['"])((?:\.{1,2}\/|\/|file:)[^'"\n]*)\1/g;
/** The most local modules an agent's identity follows. */
const MAX_AGENT_MODULES = 1000;

/**
 * A hash of an agent module and every local module it imports, transitively (what its results
 * depend on besides packages): an edited helper changes it as an edited module does. Imports
 * are found by their literal specifiers; one computed at run time is not followed.
 */
async function moduleTreeHash(entry: string, content: Buffer): Promise<string> {
  const hash = createHash('sha256');
  const seen = new Set<string>([entry]);
  const queue: [string, Buffer][] = [[entry, content]];
  for (let next = queue.shift(); next; next = queue.shift()) {
    const [path, text] = next;
    hash.update(`\0${path}\0`).update(text);
    for (const match of text.toString('utf8').matchAll(IMPORT_SPECIFIERS)) {
      const specifier = match[2]!;
      const imported = specifier.startsWith('file:')
        ? fileURLToPath(specifier)
        : resolve(dirname(path), specifier);
      if (seen.has(imported) || seen.size >= MAX_AGENT_MODULES) continue;
      seen.add(imported);
      const body = await readFile(imported).catch(() => undefined);
      // a missing file fails the import itself; a folder or a package is left to Node
      if (body) queue.push([imported, body]);
      else hash.update(`\0${imported}\0missing`);
    }
  }
  return hash.digest('hex');
}

/** `--agent openai:MODEL`: a model behind an OpenAI-compatible chat-completions endpoint. */
const OPENAI_PREFIX = 'openai:';

/** The model an `openai:MODEL` agent name names; undefined for any other agent. */
export function modelOfAgent(name: string): string | undefined {
  return name.startsWith(OPENAI_PREFIX) ? name.slice(OPENAI_PREFIX.length) : undefined;
}

/** Where an `openai:` agent's model answers, the key it takes, and how it is asked. */
export type ModelEndpoint = Partial<Omit<OpenAiAgentOptions, 'model'>>;

/** The built-in agents by name. */
export const BUILT_IN_AGENTS: Record<string, () => Agent> = { oracle: oracleAgent, nop: nopAgent };
