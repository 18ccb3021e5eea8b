import { describe, expect, it } from 'vitest';
import { destinationsOf } from '../../src/backends/host/node-network.ts';
import { networkReportOf, networkReportText } from '../../src/env/index.ts';

describe('network records', () => {
  it('reads the refused set nft lists as IP:PORT/PROTO, sorted', () => {
    const listing = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        {
          set: {
            name: 'refused0',
            elem: [{ concat: ['93.184.216.34', 'tcp', 443] }, { concat: ['10.0.0.9', 'udp', 53] }],
          },
        },
      ],
    });
    expect(destinationsOf(listing)).toEqual(['10.0.0.9:53/udp', '93.184.216.34:443/tcp']);
    expect(destinationsOf(JSON.stringify({ nftables: [{ set: { name: 'refused0' } }] }))).toEqual([]);
  });

  it('refuses a listing with more elements than the set may hold', () => {
    const elem = Array.from({ length: 17 }, (_, i) => ({ concat: [`10.0.0.${i}`, 'tcp', 80] }));
    expect(() => destinationsOf(JSON.stringify({ nftables: [{ set: { elem } }] }))).toThrow();
  });

  it('keeps only the stages that were refused something, and says them in words', () => {
    const report = networkReportOf({
      network: {
        agent: { denied: [], unresolved: [] },
        grader: { denied: ['10.0.0.9:443/tcp'], unresolved: ['archive.ubuntu.com'] },
      },
    });
    expect(report).toEqual({ grader: { denied: ['10.0.0.9:443/tcp'], unresolved: ['archive.ubuntu.com'] } });
    expect(networkReportText(report!)).toBe(
      'grader: could not resolve archive.ubuntu.com; denied 10.0.0.9:443/tcp',
    );
    // a verifier's own `network` detail of another shape is not taken for the platform's
    expect(networkReportOf({ network: 'ok' })).toBeUndefined();
  });
});
