import { describe, expect, it } from 'vitest';
import { renderHtmlReport } from '../../src/rollout/index.ts';

describe('the evaluation report', () => {
  it('summarises rewards, outcomes and step latency, and escapes what tasks and agents name', () => {
    const html = renderHtmlReport(
      'eval <script>',
      [
        {
          task: 'a<b',
          reward: 1,
          outcome: { kind: 'ok' },
          steps: 3,
          durationMs: 1500,
          tampered: [],
          timings: { create: 20, command: 30, tests: 40 },
          overheadMs: 20,
        },
        {
          task: 'c',
          reward: 0,
          outcome: { kind: 'infra_failure', reason: 'oom', message: 'x' },
          steps: 1,
          durationMs: 10,
          tampered: ['/tests'],
        },
      ],
      [
        {
          task: 'a<b',
          episodeId: 'e',
          stepIndex: 0,
          action: { type: 'exec', command: 'true' },
          observation: { type: 'submitted' },
          reward: 0,
          outcome: { kind: 'ok' },
          replayed: false,
          durationMs: 4,
        },
      ],
    );
    expect(html).toContain(
      '1 of 2 tasks resolved; 1 infrastructure or verifier outcomes (not rewards); 1 steps.',
    );
    expect(html).toContain('a&#60;b');
    expect(html).not.toContain('<script>');
    expect(html).toContain('infra_failure (oom)');
    expect(html).toContain('exec p50');
    // a stacked bar of the timed episode's phases, each named on hover
    expect(html).toContain('<title>create 20.0 ms</title>');
    expect(html).toContain('90 ms, platform 20 ms');
    expect(html).toContain('/tests');
  });

  it('shows why each episode got its reward: the reason, each metric, build notes and the verifier output', () => {
    const html = renderHtmlReport(
      'eval',
      [
        {
          task: 'multi',
          reward: 0.5,
          outcome: { kind: 'ok' },
          steps: 2,
          durationMs: 10,
          tampered: [],
          buildNotes: ['step 2/3 RUN apt-get install -y jq: cached'],
          details: {
            reason: 'tests/test.sh (exit 0) wrote reward.json',
            metrics: { accuracy: 1, style: 0 },
            stdoutTail: 'PASSED test_a <ok>',
            stderrTail: '',
          },
        },
      ],
      [],
    );
    expect(html).toContain('tests/test.sh (exit 0) wrote reward.json');
    expect(html).toContain('accuracy = 1, style = 0');
    expect(html).toContain('RUN apt-get install -y jq: cached');
    expect(html).toContain('PASSED test_a &#60;ok&#62;');
    expect(html).not.toContain('verifier stderr');
  });
});
