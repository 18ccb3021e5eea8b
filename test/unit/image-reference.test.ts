import { describe, expect, it } from 'vitest';
import { parseImageReference, standInFor } from '../../src/platform/index.ts';

describe('image references as FROM takes them', () => {
  it('takes a reference apart by Docker rules', () => {
    expect(parseImageReference('debian:bookworm')).toEqual({
      registry: 'docker.io',
      repository: 'library/debian',
      tag: 'bookworm',
      familiar: 'debian:bookworm',
    });
    expect(parseImageReference('docker.io/library/debian:bookworm').familiar).toBe('debian:bookworm');
    expect(parseImageReference('team/tool').familiar).toBe('team/tool:latest');
    const digest = `sha256:${'a'.repeat(64)}`;
    expect(parseImageReference(`127.0.0.1:5000/team/tool:1@${digest}`)).toEqual({
      registry: '127.0.0.1:5000',
      repository: 'team/tool',
      tag: '1',
      digest,
      familiar: `127.0.0.1:5000/team/tool:1@${digest}`,
    });
    expect(parseImageReference('localhost/x').registry).toBe('localhost');
  });

  it('refuses what is not a reference, saying why', () => {
    expect(() => parseImageReference('Debian:12')).toThrow(/lower-case/);
    expect(() => parseImageReference('debian@sha256:123')).toThrow(/sha256:<64 hex digits>/);
    expect(() => parseImageReference('a@b@c')).toThrow(/more than one "@"/);
  });

  it("lets the store's Debian 12 stand in for Docker Hub's Debian 12 tags only", () => {
    for (const tag of [
      'debian:12',
      'debian:bookworm-slim',
      'debian:12.8-slim',
      'debian:bookworm-20240513-slim',
    ])
      expect(standInFor(tag), tag).toBe('debian:bookworm');
    for (const tag of [
      'debian:latest',
      'debian:trixie',
      'debian:11',
      'ubuntu:22.04',
      'python:3.11-slim-bookworm',
    ])
      expect(standInFor(tag), tag).toBeUndefined();
  });
});
