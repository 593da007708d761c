// The explanations of missed #4 targets read the run's own server CPU figures, so the page never
// quotes another machine's numbers beside this run's ratios.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { evaluateTargets } from '../lib/targets.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { adapterRow } from '../suites/adapters.mjs';

interface EvaluatedTarget {
  group: string;
  verdict: string;
  measured: { median: number } | null;
  whyIfMissed: string;
}

const cpu = (median: number) => ({ median, min: median, max: median });

// A Fastify group of one round: the bare route, and idem's fresh keys and replays, each with its
// rate and, unless `withCpu` is false, the server's CPU per request.
function fastifyGroup(withCpu: boolean) {
  const row = (name: string, rate: number, micros: number) => ({
    name,
    samples: [rate],
    median: rate,
    min: rate,
    max: rate,
    ...(withCpu ? { cpuMicrosPerRequest: cpu(micros) } : {}),
  });
  return {
    id: 'adapters-fastify',
    baseline: adapterRow.bare,
    contenders: [
      row(adapterRow.bare, 10_000, 80),
      row(adapterRow.idem('memory', 'fresh'), 6_000, 130),
      row(adapterRow.idem('memory', 'replay'), 9_000, 90),
    ],
  };
}

const fastifyTargets = (withCpu: boolean): EvaluatedTarget[] =>
  (evaluateTargets([fastifyGroup(withCpu)], ['adapters']) as EvaluatedTarget[]).filter(
    (target) => target.group === 'adapters-fastify',
  );

describe('#4 targets', () => {
  it('explain a miss with the server CPU per request measured in the same run', () => {
    const [fresh, replay] = fastifyTargets(true);
    expect(fresh?.verdict).toBe('missed');
    expect(fresh?.measured?.median).toBeCloseTo(0.6, 10);
    expect(fresh?.whyIfMissed).toContain(
      'Server CPU per request in this run: the bare route 80.0 µs, idem 130.0 µs (50.0 µs more)',
    );
    // 0.85 of the bare route's rate leaves about 18% of its cost for idem.
    expect(fresh?.whyIfMissed).toContain('0.85 would leave Fastify about 14 µs for all of it');
    expect(replay?.verdict).toBe('missed');
    expect(replay?.whyIfMissed).toContain('the bare route 80.0 µs, idem 90.0 µs (10.0 µs more)');
    // 80 µs per request at 10,000 requests per second is 80% of one core: the load generator is the limit.
    expect(replay?.whyIfMissed).toContain("with the bare route's server at 80% of a core");
  });

  it('give no figures when the run did not measure the server CPU', () => {
    for (const target of fastifyTargets(false)) {
      expect(target.verdict).toBe('missed');
      expect(target.whyIfMissed).not.toContain('Server CPU');
      expect(target.whyIfMissed.length).toBeGreaterThan(40);
    }
  });
});
