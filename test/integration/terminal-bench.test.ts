import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTasks, parsePytestSummary } from '../../src/env/index.ts';
import { evaluate, nopAgent, oracleAgent, scriptedAgent } from '../../src/rollout/index.ts';
import { createTestPlatform, debianMirrorRules, type TestPlatform } from '../support/platform.ts';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'tasks', 'terminal-bench');

/** Terminal-Bench 1 task folders as published, graded as that harness grades them. */
describe('Terminal-Bench tasks', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    // the apt-based fixture's Dockerfile reaches the Debian mirror while it builds
    env = await createTestPlatform('terminal-bench', {
      privateStore: true,
      seed: ['debian:bookworm'],
      networkRules: await debianMirrorRules(),
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('loads task.yaml as the harness reads it: instruction or descriptions, its timeouts, its oracle', async () => {
    const tasks = await loadTasks([FIXTURES]);
    expect(tasks.map((t) => t.id)).toEqual([
      'apt-jq',
      'apt-jq-csv',
      'compose-redis',
      'count-lines',
      'dockerignore-copy',
      'env-paths',
      'heredoc-config',
      'legacy-descriptions',
      'multi-stage',
      'nonroot-user',
      'tar-add',
      'yaml-steps',
    ]);
    const byId = (id: string) => tasks.find((t) => t.id === id);
    const [apt, compose, count, legacy, yaml] = [
      'apt-jq',
      'compose-redis',
      'count-lines',
      'legacy-descriptions',
      'yaml-steps',
    ].map(byId);
    expect(count).toMatchObject({
      id: 'count-lines',
      format: 'terminal-bench',
      agentTimeoutMs: 120_000,
      verifierTimeoutMs: 60_000,
      env: { TEST_DIR: '/tests' },
      oracle: { kind: 'shell', path: '/oracle/solution.sh' },
    });
    // docker-compose.yaml names only the task's own container: no services beside it
    expect(count?.services).toBeUndefined();
    // a service with its own build context; the harness's ${...} variables are left out
    expect(compose?.services).toEqual([
      {
        name: 'cache',
        source: {
          kind: 'dockerfile',
          dockerfile: join(FIXTURES, 'compose-redis', 'cache', 'Dockerfile'),
          context: join(FIXTURES, 'compose-redis', 'cache'),
          // the task's folder, beneath which the build must stay
          root: join(FIXTURES, 'compose-redis'),
        },
        env: { CACHE_ROLE: 'primary' },
      },
    ]);
    expect(legacy?.instruction).toMatch(/^Write a Python module/);
    expect(legacy).toMatchObject({ agentTimeoutMs: 200_000, verifierTimeoutMs: 30_000 });
    expect(apt?.agentTimeoutMs).toBe(300_000);
    // solution.yaml's commands run in one shell, so a cd carries over
    expect(yaml?.oracle).toMatchObject({
      script: 'mkdir -p /srv/site\ncd /srv/site\necho ready > index.html\n',
    });
  });

  it('passes every oracle and fails every nop, reading pytest as the harness does', async () => {
    const tasks = await loadTasks([FIXTURES]);
    const oracle = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 2 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual(tasks.map((t) => [t.id, 1, 'ok']));
    const yaml = oracle.find((r) => r.task === 'yaml-steps');
    // skipped and expected-to-fail tests count as passed, as the harness counts them; an XFAIL
    // line keeps its reason in the name, as Terminal-Bench's parser keeps it
    expect(yaml?.details?.['tests']).toMatchObject({
      test_index_says_ready: 'PASSED',
      'test_robots - the site has no robots.txt yet': 'XFAIL',
    });
    const nop = await evaluate(env.platform, tasks, nopAgent, { concurrency: 2 });
    expect(nop.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual(tasks.map((t) => [t.id, 0, 'ok']));
    expect(String(nop.find((r) => r.task === 'count-lines')?.details?.['reason'])).toMatch(
      /2 of 2 tests did not pass: test_file_exists FAILED/,
    );
    // the redis service went with its episode: no service sandbox and no group network left
    const services = (await env.platform.listSandboxes()).filter((s) => s.labels?.['service']);
    expect(services).toEqual([]);
    // no group network of this process is left (other test files may hold theirs right now)
    const ownerOf = (claim: string): string => {
      try {
        return readFileSync(join('/run/sandgym/groups', claim, 'owner.json'), 'utf8');
      } catch {
        return ''; // a claim another process is making right now
      }
    };
    const claims = readdirSync('/run/sandgym/groups').filter((claim) =>
      ownerOf(claim).includes(`"pid":${process.pid},`),
    );
    expect(claims).toEqual([]);
    // two dozen episodes, on two cores shared with the rest of the suite
  }, 600_000);
});

/** A redis stand-in that answers what the compose-redis tests ask, and nothing real. */
const FAKE_REDIS = `import socket, threading
def serve(conn):
    data = conn.recv(4096)
    while data:
        if b'LRANGE' in data:
            conn.sendall(b'*3\\r\\n$1\\r\\n1\\r\\n$1\\r\\n2\\r\\n$1\\r\\n3\\r\\n')
        else:
            conn.sendall(b'$5\\r\\nhello\\r\\n')
        data = conn.recv(4096)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('0.0.0.0', 6379))
server.listen()
while True:
    threading.Thread(target=serve, args=(server.accept()[0],)).start()
`;

describe('Terminal-Bench services under attack', () => {
  it('keeps an agent that points the service name at a fake of its own from passing', async () => {
    await using env = await createTestPlatform('terminal-bench-attack', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    const [task] = await loadTasks([join(FIXTURES, 'compose-redis')]);
    // leave a fake redis running on its own group address, and name it "cache" in /etc/hosts
    const cheat = scriptedAgent([
      { type: 'write_file', path: '/tmp/fake.py', content: FAKE_REDIS },
      { type: 'exec', command: 'nohup python3 /tmp/fake.py >/dev/null 2>&1 &' },
      {
        type: 'exec',
        command:
          'me=$(python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((\'cache\', 6379)); print(s.getsockname()[0])") && ' +
          '{ echo "$me cache"; cat /etc/hosts; } > /tmp/hosts && cat /tmp/hosts > /etc/hosts && ' +
          // the fake answers as redis would
          'redis-cli -h $me GET greeting',
      },
    ]);
    const [report] = await evaluate(env.platform, [task!], () => cheat, { concurrency: 1 });
    expect([report?.reward, report?.outcome.kind]).toEqual([0, 'ok']);
  });
});

describe('the pytest summary parser', () => {
  it('takes outcomes after the summary header only, and needs one', () => {
    const output = [
      'PASSED tests/test_a.py::not_in_summary',
      '=========================== short test summary info ============================',
      'PASSED tests/test_a.py::test_one',
      'FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2',
      'ERROR tests/test_b.py::test_setup - ValueError',
      'XPASS tests/test_a.py::test_lucky - flaky',
      'XFAIL tests/test_a.py::test_known - not yet',
      'SKIPPED [1] tests/test_a.py:9: later',
      '==================== 1 failed, 1 passed in 0.12s ====================',
    ].join('\n');
    // names as Terminal-Bench gives them (only a FAILED line loses its message there); node ids whole
    expect(parsePytestSummary(output)?.map((r) => [r.test, r.nodeId, r.outcome, r.passed])).toEqual([
      ['test_one', 'tests/test_a.py::test_one', 'PASSED', true],
      ['test_two', 'tests/test_a.py::test_two', 'FAILED', false],
      ['test_setup - ValueError', 'tests/test_b.py::test_setup', 'ERROR', false],
      ['test_lucky - flaky', 'tests/test_a.py::test_lucky', 'XPASS', false],
      ['test_known - not yet', 'tests/test_a.py::test_known', 'XFAIL', true],
      ['[1] tests/test_a.py:9: later', '[1] tests/test_a.py:9: later', 'SKIPPED', true],
    ]);
    expect(parsePytestSummary('collected 0 items\n')).toBeUndefined();
  });
});
