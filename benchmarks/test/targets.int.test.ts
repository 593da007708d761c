// The explanations of missed #4 targets read the run's own server CPU figures, so the page never
// quotes another machine's numbers beside this run's ratios.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { evaluateTargets } from '../lib/targets.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { adapterRow } from '../suites/adapters.mjs';
import { row as measured } from './fixtures.js';

interface EvaluatedTarget {
  group: string;
  verdict: string;
  measured: { median: number } | null;
  whyIfMissed: string;
}

const cpu = (median: number) => ({ median, min: median, max: median });

// A Fastify group of one round: the bare route, and idem's fresh keys and replays, each with its
// rate and, unless `withCpu` is false, the server's CPU per request; `minimal` adds the minimal
// layer's fresh-key and replay rows at those rates, `calibration` the calibration row at its rate.
function fastifyGroup(
  withCpu: boolean,
  minimal?: { fresh: number; replay: number },
  calibration?: number,
  framework = 'fastify',
) {
  const row = (name: string, rate: number, micros: number) =>
    measured(name, rate, withCpu ? { cpuMicrosPerRequest: cpu(micros) } : {});
  return {
    id: `adapters-${framework}`,
    baseline: adapterRow.bare,
    contenders: [
      row(adapterRow.bare, 10_000, 80),
      row(adapterRow.idem('memory', 'fresh'), 6_000, 130),
      row(adapterRow.idem('memory', 'replay'), 9_000, 90),
      ...(minimal
        ? [row(adapterRow.minimal('fresh'), minimal.fresh, 85), row(adapterRow.minimal('replay'), minimal.replay, 78)]
        : []),
      ...(calibration === undefined ? [] : [row(adapterRow.calibration, calibration, 85)]),
    ],
  };
}

const fastifyTargets = (
  withCpu: boolean,
  minimal?: { fresh: number; replay: number },
  calibration?: number,
): EvaluatedTarget[] =>
  (evaluateTargets([fastifyGroup(withCpu, minimal, calibration)], ['adapters']) as EvaluatedTarget[]).filter(
    (target) => target.group === 'adapters-fastify',
  );

// The same rows in another framework's group: its targets, in page order (fresh keys, then replays).
const targetsOf = (framework: string): EvaluatedTarget[] =>
  (evaluateTargets([fastifyGroup(true, undefined, undefined, framework)], ['adapters']) as EvaluatedTarget[]).filter(
    (target) => target.group === `adapters-${framework}`,
  );

describe('#4 targets', () => {
  it('say where idem reads the body before the framework parses it, and so reads it twice on a first execution', () => {
    for (const framework of ['express', 'koa']) {
      const [fresh] = targetsOf(framework);
      expect(fresh?.whyIfMissed).toContain('each write must wake it). Mounted before ');
      expect(fresh?.whyIfMissed).toContain('a first execution reads the body twice. Server CPU per request');
    }
    const [, expressReplay] = targetsOf('express');
    expect(expressReplay?.whyIfMissed).toContain(
      'mounted before express.json(), as the guide has it, it skips the parser',
    );
    // Fastify's plugin fingerprints the value Fastify parsed: one read.
    for (const target of targetsOf('fastify')) expect(target.whyIfMissed).not.toContain('twice');
  });

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

  it('set a miss beside the minimal layer of the same rounds, when the run measured it', () => {
    const [fresh, replay] = fastifyTargets(true, { fresh: 8_900, replay: 9_800 });
    // 0.89 of the bare route: 0.85 lets idem run at most 1 - 0.85/0.89, about 4%, below it.
    expect(fresh?.whyIfMissed).toContain('A minimal layer in the same rounds');
    expect(fresh?.whyIfMissed).toContain('ran at 0.89 of the bare route: to meet 0.85, idem may run at most 4% below');
    // One sentence after another, and no full stop of its own: the page adds the last one.
    expect(fresh?.whyIfMissed).toContain('for all of it. A minimal layer');
    expect(fresh?.whyIfMissed.endsWith('.')).toBe(false);
    // 0.98 of the bare route, below the replay target of 1.0.
    expect(replay?.whyIfMissed).toContain('ran at 0.98 of the bare route: 1.00 is above what even that layer reaches');
    expect(replay?.whyIfMissed).toContain('shows in full). A minimal layer');
    // Without CPU figures the sentence follows the reason directly.
    const [freshNoCpu, replayNoCpu] = fastifyTargets(false, { fresh: 8_900, replay: 9_800 });
    expect(freshNoCpu?.whyIfMissed).toContain('each write must wake it). A minimal layer');
    expect(replayNoCpu?.whyIfMissed).toContain('whose cost on this route is small. A minimal layer');
    // A run without the minimal rows says nothing of them.
    for (const target of fastifyTargets(true)) expect(target.whyIfMissed).not.toContain('minimal layer');
  });

  it('read the ratios as microseconds of added work through the calibration row of the same rounds', () => {
    // The bare route plus 5 µs ran at 0.8 of it: 1/0.8 - 1 = 0.25 = 5k, so k = 0.05 per µs.
    const [fresh, replay] = fastifyTargets(true, { fresh: 8_900, replay: 9_800 }, 8_000);
    expect(fresh?.whyIfMissed).toContain(
      'The bare route with 5 µs of busy work per request ran at 0.80 of it in the same rounds.',
    );
    // 0.85: (1/0.85 - 1) / 0.05 = 3.5 µs. idem at 0.6: (1/0.6 - 1) / 0.05 = 13.3 µs; the layer at 0.89: 2.5 µs.
    expect(fresh?.whyIfMissed).toContain('0.85 allows about 3.5 µs of added work per request');
    expect(fresh?.whyIfMissed).toContain("idem's 0.60 matches about 13.3 µs of added work");
    expect(fresh?.whyIfMissed).toContain("the minimal layer's 0.89 matches about 2.5 µs of added work");
    // The calibrated budget replaces the flat share of the bare route's CPU time, which understates it.
    expect(fresh?.whyIfMissed).not.toContain('for all of it');
    expect(fresh?.whyIfMissed).toContain('(50.0 µs more). The bare route with 5 µs');
    expect(fresh?.whyIfMissed).toContain('of added work. A minimal layer in the same rounds');
    // Replays: 1.0 allows nothing; idem at 0.9 is (1/0.9 - 1) / 0.05 = 2.2 µs.
    expect(replay?.whyIfMissed).toContain('1.00 allows no added work at all');
    expect(replay?.whyIfMissed).toContain("idem's 0.90 matches about 2.2 µs of added work. A minimal layer");
    // Without CPU figures the sentence follows the reason directly.
    const [freshNoCpu] = fastifyTargets(false, undefined, 8_000);
    expect(freshNoCpu?.whyIfMissed).toContain('each write must wake it). The bare route with 5 µs');
    expect(freshNoCpu?.whyIfMissed.endsWith('.')).toBe(false);
    // A calibration that did not slow the route is no model: nothing is read through it.
    for (const target of fastifyTargets(true, undefined, 10_000)) {
      expect(target.whyIfMissed).not.toContain('busy work');
    }
  });
});
