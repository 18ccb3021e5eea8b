/**
 * `hostname:NAME` network rules (Harbor's allowed_hosts): a name resolves to `host:IP` rules when
 * a sandbox's network is set up, and never to a path to the node. Hostile: names and answers that
 * point at loopback, link-local metadata, private ranges or the node's own addresses are refused,
 * naming the host and why; honest twin: a public host's addresses become its rules.
 */
import { networkInterfaces } from 'node:os';
import { describe, expect, it } from 'vitest';
import { checkHostnameRules, resolveHostnameRules } from '../../src/backends/host/hostname-rules.ts';

/** A resolver that answers from a table, as a task author's DNS could. */
const answers =
  (table: Record<string, string[]>) =>
  (host: string): Promise<string[]> =>
    table[host] ? Promise.resolve(table[host]) : Promise.reject(new Error(`ENOTFOUND ${host}`));

const nodeAddress = Object.values(networkInterfaces())
  .flat()
  .find((a) => a?.family === 'IPv4' && !a.internal)?.address;

describe('hostname rules', () => {
  it("honest: a public host's addresses become its rules, other rules kept", async () => {
    const lookup = answers({ 'deb.debian.org': ['151.101.2.132', '151.101.66.132'] });
    await expect(resolveHostnameRules(['hostname:deb.debian.org', 'dns?'], lookup)).resolves.toEqual([
      'host:151.101.2.132',
      'host:151.101.66.132',
      'dns?',
    ]);
  });

  it.each([
    ['localhost', /"localhost" has no dot/],
    ['metadata.google.internal', /names the node's own or a local network/],
    ['printer.local', /names the node's own or a local network/],
    ['169.254.169.254', /is an address/],
    ['127.0.0.1', /is an address/],
    ['*.example.com', /is a wildcard/],
  ])('hostile: refuses the name %s before anything resolves it', (host, why) => {
    expect(() => checkHostnameRules([`hostname:${host}`])).toThrow(why);
  });

  it.each([
    ['loopback', '127.0.0.1', /resolves to 127\.0\.0\.1, loopback/],
    ['metadata', '169.254.169.254', /resolves to 169\.254\.169\.254, link-local/],
    ['private 10/8', '10.255.255.53', /a private address/],
    ['private 172.16/12', '172.17.0.1', /a private address/],
    ['private 192.168/16', '192.168.1.1', /a private address/],
    ['a sandbox network', '100.64.0.7', /a sandbox network/],
  ])('hostile: refuses a public-looking name that resolves to %s', async (_, address, why) => {
    const lookup = answers({ 'evil.example.com': ['93.184.216.34', address] });
    const resolving = resolveHostnameRules(['hostname:evil.example.com'], lookup);
    await expect(resolving).rejects.toThrow(/Network rule "hostname:evil\.example\.com": evil\.example\.com/);
    await expect(resolving).rejects.toThrow(why);
  });

  it.runIf(nodeAddress)("hostile: refuses a name that resolves to the node's own address", async () => {
    const lookup = answers({ 'me.example.com': [nodeAddress!] });
    await expect(resolveHostnameRules(['hostname:me.example.com'], lookup)).rejects.toThrow(
      /an address of the node itself|a private address/,
    );
  });

  it('a name that does not resolve fails, unless the rule is optional', async () => {
    const lookup = answers({});
    await expect(resolveHostnameRules(['hostname:gone.example.com'], lookup)).rejects.toThrow(
      /gone\.example\.com does not resolve from this node/,
    );
    await expect(resolveHostnameRules(['hostname:gone.example.com?'], lookup)).resolves.toEqual([]);
  });
});
