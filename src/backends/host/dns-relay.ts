import { randomInt } from 'node:crypto';
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import {
  RCODE,
  buildQuery,
  emptyAnswer,
  parseAnswerHead,
  parseQuery,
  sameQuestion,
  type DnsQuery,
} from './dns-message.ts';

/** A resolver the relay forwards to: `IP:PORT`. */
export type ResolverKey = string;

/** How much of the relay one sandbox may use. */
export interface RelayLimits {
  /** Queries a sandbox may send at once (a burst); beyond, they are dropped unanswered. */
  burst: number;
  /** Queries per second its allowance grows back by. */
  perSecond: number;
  /** Its queries waiting for the upstream at once. */
  pending: number;
  /** Distinct names it keeps as unresolved per stage. */
  kept: number;
  /** How long the upstream has to answer before the name counts as unresolved. */
  answerMs: number;
}

const DEFAULT_LIMITS: RelayLimits = { burst: 64, perSecond: 32, pending: 32, kept: 16, answerMs: 4000 };

/** Every query waiting for an upstream, all sandboxes together, per resolver: an id is 16 bits. */
const MAX_PENDING = 4096;

/** One sandbox as the relay knows it, by its address on the node network. */
interface Client {
  /** Resolvers its current rules reach: what it may ask. */
  resolvers: Set<ResolverKey>;
  unresolved: Set<string>;
  tokens: number;
  refilledAt: number;
  pending: number;
  /** Bumped when it is forgotten or its stage changes: late answers of before go nowhere. */
  generation: number;
}

interface Waiting {
  client: string;
  generation: number;
  port: number;
  id: number;
  query: DnsQuery;
  timer: NodeJS.Timeout;
}

/** The relay's ends for one upstream resolver. */
interface Route {
  key: ResolverKey;
  /** Where sandboxes' queries to the resolver arrive (the node network's rules redirect them here). */
  listener: Socket;
  /** Connected to the resolver: the kernel lets only its answers in. */
  upstream: Socket;
  waiting: Map<number, Waiting>;
}

/**
 * The sandboxes' resolver, as they see it: their queries to a resolver of the node's `dns` rule
 * are redirected here (see NodeNetwork), forwarded to that resolver only when the sandbox's
 * rules reach it, and answered. What does not resolve (NXDOMAIN, SERVFAIL, REFUSED, no answer,
 * or asked without the rule) is kept per sandbox, by its source address: the platform gives
 * sandboxes no CAP_NET_RAW or CAP_NET_ADMIN, so one cannot send as another.
 *
 * The agent writes every byte a sandbox sends here. The relay never forwards those bytes: it
 * parses one question (see dns-message.ts) and asks the resolver a query of its own. It answers
 * only sandboxes it knows, never with more bytes than they sent unless the resolver answered,
 * and bounds each sandbox's rate, waiting queries and records.
 */
export class DnsRelay {
  private readonly clients = new Map<string, Client>();
  private closed = false;

  private constructor(
    private readonly routes: Route[],
    private readonly limits: RelayLimits,
  ) {
    for (const route of routes) {
      route.listener.on('message', (packet, from) => this.onQuery(route, packet, from));
      route.upstream.on('message', (packet) => this.onAnswer(route, packet));
      // a send that fails (an unreachable resolver, a sandbox gone) costs the query, not the relay
      route.listener.on('error', () => undefined);
      route.upstream.on('error', () => undefined);
    }
  }

  /** Listens on `address` (a port per resolver, see {@link portOf}) and connects to each resolver. */
  static async open(
    address: string,
    resolvers: readonly { address: string; port: number }[],
    limits: Partial<RelayLimits> = {},
  ): Promise<DnsRelay> {
    const routes: Route[] = [];
    try {
      for (const resolver of resolvers) {
        const listener = createSocket('udp4');
        const upstream = createSocket('udp4');
        routes.push({ key: `${resolver.address}:${resolver.port}`, listener, upstream, waiting: new Map() });
        await new Promise<void>((resolve, reject) => {
          listener.once('error', reject);
          listener.bind(0, address, () => resolve());
        });
        await new Promise<void>((resolve, reject) => {
          upstream.once('error', reject);
          upstream.connect(resolver.port, resolver.address, () => resolve());
        });
      }
    } catch (error) {
      for (const route of routes) closeRoute(route);
      throw error;
    }
    return new DnsRelay(routes, { ...DEFAULT_LIMITS, ...limits });
  }

  /** The port queries for `resolver` arrive on. */
  portOf(resolver: ResolverKey): number | undefined {
    return this.routes.find((route) => route.key === resolver)?.listener.address().port;
  }

  get resolvers(): ResolverKey[] {
    return this.routes.map((route) => route.key);
  }

  /**
   * The sandbox at `address` starts a stage that may ask `resolvers` (the rest are refused):
   * its record starts empty, and answers to its earlier queries go nowhere.
   */
  permit(address: string, resolvers: readonly ResolverKey[]): void {
    const before = this.clients.get(address);
    this.clients.set(address, {
      resolvers: new Set(resolvers),
      unresolved: new Set(),
      tokens: before?.tokens ?? this.limits.burst,
      refilledAt: before?.refilledAt ?? performance.now(),
      pending: before?.pending ?? 0,
      generation: (before?.generation ?? 0) + 1,
    });
  }

  /** The sandbox at `address` may ask only `resolvers` from now on; its record stays. */
  restrict(address: string, resolvers: readonly ResolverKey[]): void {
    const client = this.clients.get(address);
    if (client) client.resolvers = new Set(resolvers);
  }

  /** The sandbox at `address` is gone: nothing of it is kept, and nothing reaches its successor. */
  forget(address: string): void {
    this.clients.delete(address);
    for (const route of this.routes)
      for (const [id, waiting] of route.waiting)
        if (waiting.client === address) {
          clearTimeout(waiting.timer);
          route.waiting.delete(id);
        }
  }

  /** Names the sandbox at `address` asked in its current stage that did not resolve, sorted. */
  unresolved(address: string): string[] {
    return [...(this.clients.get(address)?.unresolved ?? [])].sort();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const route of this.routes) {
      for (const waiting of route.waiting.values()) clearTimeout(waiting.timer);
      route.waiting.clear();
      closeRoute(route);
    }
    this.clients.clear();
  }

  private onQuery(route: Route, packet: Buffer, from: RemoteInfo): void {
    const client = this.clients.get(from.address);
    // a sender the relay does not know gets nothing, and costs nothing
    if (!client || !this.take(client)) return;
    const query = parseQuery(packet);
    if (!query) return;
    if (!client.resolvers.has(route.key)) {
      this.note(client, query.question.name);
      route.listener.send(emptyAnswer(query, RCODE.refused), from.port, from.address);
      return;
    }
    if (client.pending >= this.limits.pending || route.waiting.size >= MAX_PENDING) return;
    const id = freeId(route.waiting);
    const waiting: Waiting = {
      client: from.address,
      generation: client.generation,
      port: from.port,
      id: query.id,
      query,
      timer: setTimeout(() => this.settle(route, id, undefined), this.limits.answerMs),
    };
    waiting.timer.unref();
    route.waiting.set(id, waiting);
    client.pending++;
    route.upstream.send(buildQuery(id, query.question, query.rd));
  }

  private onAnswer(route: Route, packet: Buffer): void {
    const head = parseAnswerHead(packet);
    const waiting = head && route.waiting.get(head.id);
    // an answer must be to the question asked under its id
    if (!head || !waiting || !sameQuestion(head.question, waiting.query.question)) return;
    this.settle(route, head.id, { rcode: head.rcode, packet });
  }

  /** Ends a waiting query: with the upstream's answer, or with none (it took too long). */
  private settle(route: Route, id: number, answer: { rcode: number; packet: Buffer } | undefined): void {
    const waiting = route.waiting.get(id);
    if (!waiting) return;
    route.waiting.delete(id);
    clearTimeout(waiting.timer);
    const client = this.clients.get(waiting.client);
    if (!client) return;
    client.pending = Math.max(0, client.pending - 1);
    if (client.generation !== waiting.generation) return;
    const failed =
      !answer ||
      answer.rcode === RCODE.nxDomain ||
      answer.rcode === RCODE.servFail ||
      answer.rcode === RCODE.refused;
    if (failed) this.note(client, waiting.query.question.name);
    const reply = answer ? Buffer.from(answer.packet) : emptyAnswer(waiting.query, RCODE.servFail);
    reply.writeUInt16BE(waiting.id, 0);
    route.listener.send(reply, waiting.port, waiting.client);
  }

  private note(client: Client, name: string): void {
    if (client.unresolved.size < this.limits.kept) client.unresolved.add(name);
  }

  /** Takes one query from the client's allowance; false when it has none left. */
  private take(client: Client): boolean {
    const now = performance.now();
    client.tokens = Math.min(
      this.limits.burst,
      client.tokens + ((now - client.refilledAt) / 1000) * this.limits.perSecond,
    );
    client.refilledAt = now;
    if (client.tokens < 1) return false;
    client.tokens--;
    return true;
  }
}

/** An id no waiting query of the route has (the route never holds more than {@link MAX_PENDING}). */
function freeId(waiting: Map<number, Waiting>): number {
  for (;;) {
    const id = randomInt(0, 65536);
    if (!waiting.has(id)) return id;
  }
}

function closeRoute(route: Route): void {
  for (const socket of [route.listener, route.upstream]) {
    try {
      socket.close();
    } catch {
      // never bound, or closed already
    }
  }
}
