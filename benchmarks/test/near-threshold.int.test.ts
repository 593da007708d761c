// A ratio just below its target must not be printed as the target itself: "0.85 | missed" beside
// "≥ 0.85", or "ran at 0.85 of the bare route: 0.85 is above what even that layer reaches" (the
// published page said that of Koa's minimal layer at 0.8466), reads as a contradiction.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { renderReport } from '../lib/report.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { ratioText } from '../lib/stats.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { ratioChart } from '../lib/svg-chart.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { evaluateTargets } from '../lib/targets.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { adapterRow } from '../suites/adapters.mjs';
import { row, savedRun } from './fixtures.js';

interface Target {
  text: string;
  verdict: string;
  whyIfMissed: string;
}

// A Koa group of one round: idem's fresh keys at 0.849 of the bare route, the minimal layer at 0.8466.
const koaGroup = {
  id: 'adapters-koa',
  title: 'Koa: POST /charges',
  unit: 'req/s',
  baseline: adapterRow.bare,
  rounds: 1,
  contenders: [
    row(adapterRow.bare, 10_000),
    row(adapterRow.idem('memory', 'fresh'), 8_490, { ratio: { median: 0.849, min: 0.849, max: 0.849 } }),
    row(adapterRow.minimal('fresh'), 8_466, { ratio: { median: 0.8466, min: 0.8466, max: 0.8466 } }),
  ],
};

describe('a ratio just below its target', () => {
  it('gets the digits that keep it apart from the target, and only then', () => {
    expect(ratioText(0.849, 0.85)).toBe('0.849');
    expect(ratioText(0.8499, 0.85)).toBe('0.8499');
    expect(ratioText(0.996, 1)).toBe('0.996');
    expect(ratioText(0.85, 0.85)).toBe('0.85');
    expect(ratioText(0.8466, 0.9)).toBe('0.85');
    expect(ratioText(0.857, 0.85)).toBe('0.86');
  });

  it('is printed so in the targets table, the chart and the explanation', () => {
    const targets = evaluateTargets([koaGroup], ['adapters']) as Target[];
    const fresh = targets.find((target) => target.text === 'Koa: idem on memoryStore, fresh keys / bare route');
    expect(fresh?.verdict).toBe('missed');
    expect(fresh?.whyIfMissed).toContain('ran at 0.847 of the bare route: 0.85 is above what even that layer reaches');
    const page: string = renderReport(
      savedRun({ suites: [{ id: 'adapters', title: 'Adapters', groups: [koaGroup] }], targets }),
      undefined,
    );
    expect(page).toContain('| ≥ 0.85 | 0.849 (0.849 – 0.849) | missed |');
    expect(ratioChart(targets, 'ratios')).toContain('>0.849</text>');
  });
});
