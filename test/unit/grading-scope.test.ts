import { describe, expect, it } from 'vitest';
import { gradingScope } from '../../src/env/grading-scope.ts';

const PATH_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

describe('the grading scope of the links on PATH', () => {
  it("fits an image's hundreds of alternatives in the lists a scope goes over the wire in", () => {
    // a Debian image with a JDK and TeX holds hundreds of /usr/bin -> /etc/alternatives links
    const linkHops = Array.from({ length: 400 }, (_, i) => `/etc/alternatives/tool${i}`);
    const scope = gradingScope({ pathDirs: PATH_DIRS, linkHops }, '/app');
    // packDiff's wire takes at most 256 paths per list
    expect(scope.excludePaths.length).toBeLessThanOrEqual(256);
    expect(scope.reportPaths.length).toBeLessThanOrEqual(256);
    expect(scope.excludePaths).toContain('etc/alternatives');
  });

  it('protects a hop in a top-level folder alone, and none in the workdir or the protected folders', () => {
    const linkHops = ['/etc/tool', '/app/solve.sh', '/usr/bin/mawk', '/opt/conda/bin/python3.11'];
    const scope = gradingScope({ pathDirs: PATH_DIRS, linkHops }, '/app');
    expect(scope.excludePaths).toEqual(expect.arrayContaining(['etc/tool', 'opt/conda/bin']));
    // the agent's work and the rest of /etc stay its own
    expect(scope.excludePaths).not.toContain('etc');
    expect(scope.excludePaths.some((path) => path.startsWith('app'))).toBe(false);
    expect(scope.reportPaths).toEqual(expect.arrayContaining(['etc/tool', 'opt/conda/bin']));
  });
});
