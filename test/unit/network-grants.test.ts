import { describe, expect, it } from 'vitest';
import { checkNetworkGrant, grantedRules } from '../../src/backends/host/network-grants.ts';
import { controlPlaneOf } from '../../src/backends/host/egress-guard.ts';
import { resolveRules } from '../../src/backends/host/network-rules.ts';
import { isSandgymError } from '../../src/common/index.ts';

const GRANT = ['mirror:debian', 'dns', 'cidr:10.9.0.0/16', 'host:10.1.2.3:443'];

function refusal(rules: string[], grant: readonly string[] = GRANT): string | undefined {
  try {
    grantedRules(rules, grant, 'project p');
    return undefined;
  } catch (error) {
    expect(isSandgymError(error, 'permission_denied')).toBe(true);
    return (error as Error).message;
  }
}

describe('network grants', () => {
  it('allows granted names, and hosts, ranges and ports inside a granted set', () => {
    const allowed = [
      'mirror:debian',
      'dns?',
      'cidr:10.9.0.0/16',
      'cidr:10.9.4.0/24:8080',
      'host:10.9.255.255',
      'cidr:10.9.1.1/16', // host bits set: the same /16
      'host:10.1.2.3:443',
      'cidr:10.1.2.3/32:443',
    ];
    expect(grantedRules(allowed, GRANT, 'project p')).toEqual(allowed);
  });

  it('refuses anything wider, elsewhere, on another port or merely spelled differently', () => {
    for (const rule of [
      'cidr:0.0.0.0/0',
      'cidr:0.0.0.0/1',
      'cidr:10.8.0.0/15',
      'cidr:10.10.0.0/16',
      'host:10.1.2.3',
      'host:10.1.2.3:444',
      'cidr:10.1.2.2/31:443',
      'mirror:npm',
      'mirror:debian:80',
      'Mirror:debian',
      'host:127.0.0.1',
    ]) {
      expect(refusal([rule]), rule).toContain(`"${rule}" is not granted to project p`);
    }
    expect(refusal(['dns'], [])).toMatch(/loopback only/);
  });

  it('leaves out optional rules beyond the grant, and keeps the granted ones in order', () => {
    expect(grantedRules(['internet?', 'dns', 'cidr:0.0.0.0/0?', 'mirror:debian?'], GRANT, 'p')).toEqual([
      'dns',
      'mirror:debian?',
    ]);
  });

  it('checks a grant when it is read', () => {
    expect(() => checkNetworkGrant(GRANT, 'grant')).not.toThrow();
    expect(() => checkNetworkGrant(['cidr:10.0.0.0/33'], 'grant')).toThrow(/not an address/);
    expect(() => checkNetworkGrant(['bad name'], 'grant')).toThrow(/not a network rule/);
    expect(() =>
      checkNetworkGrant(
        Array.from({ length: 65 }, (_, i) => `r${i}`),
        'grant',
      ),
    ).toThrow(/at most 64/);
  });
});

describe('rules and the control plane', () => {
  it('resolves a range to its network, whatever host bits it was written with', () => {
    expect(resolveRules(['cidr:10.9.1.1/16:80', 'host:1.2.3.4'], {})).toEqual([
      { cidr: '10.9.0.0/16', port: 80 },
      { cidr: '1.2.3.4/32' },
    ]);
  });

  it('reads endpoints as networks kept out on every port and ports kept out everywhere', () => {
    expect(
      controlPlaneOf([
        '10.0.0.2:7443',
        '10.0.0.0/24',
        ':9400',
        'http://10.0.0.5:2379',
        'https://etcd.example:2379',
      ]),
    ).toEqual({ hosts: ['10.0.0.2/32', '10.0.0.0/24', '10.0.0.5/32'], ports: [7443, 9400, 2379, 2379] });
    expect(() => controlPlaneOf([':0'])).toThrow(/1 to 65535/);
    expect(() => controlPlaneOf(['controller:7443'])).toThrow(/not an address/);
  });
});
