// A contender that fails in a later round (a window of 500s, a crashed server) keeps the samples of
// the rounds before it, but the run must say it failed: a target read from it is not called met on
// the rounds that happened to pass, and the page lists the failure with its reason.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { renderReport } from '../lib/report.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { runGroup } from '../lib/rounds.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { ratioChart } from '../lib/svg-chart.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { evaluateTargets } from '../lib/targets.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { adapterRow } from '../suites/adapters.mjs';
import { savedRun } from './fixtures.js';

// A measure() that answers `rates` round after round and fails once they run out.
const rounds = (rates: number[]) => {
  let round = 0;
  return async () => {
    const rate = rates[round++];
    if (rate === undefined) throw new Error('unexpected statuses from http://127.0.0.1/charges: 50 x 500');
    return rate;
  };
};

const fresh = adapterRow.idem('memory', 'fresh');
const targetText = 'Express: idem on memoryStore, fresh keys / bare route';

async function expressGroup() {
  return runGroup(
    {
      id: 'adapters-express',
      title: 'Express: POST /charges',
      unit: 'req/s',
      baseline: adapterRow.bare,
      contenders: [
        { name: adapterRow.bare, measure: rounds([100, 100, 100]) },
        // 0.90 of the bare route in round 1 (above the 0.85 target), then a window of 500s.
        { name: fresh, measure: rounds([90]) },
      ],
    },
    { rounds: 3, quick: false },
    () => {},
  );
}

describe('a contender that fails after its first round', () => {
  it('keeps its samples and says in which round it failed and why', async () => {
    const group = await expressGroup();
    const row = group.contenders.find((candidate: { name: string }) => candidate.name === fresh);
    expect(row.samples).toEqual([90, null, null]);
    expect(row.failure).toEqual({
      round: 2,
      reason: 'unexpected statuses from http://127.0.0.1/charges: 50 x 500',
    });
  });

  it('leaves its targets not measured, listed with the failure, and off the chart', async () => {
    const group = await expressGroup();
    const targets = evaluateTargets([group], ['adapters']);
    const target = targets.find((candidate: { text: string }) => candidate.text === targetText);
    expect(target.verdict).toBe('not measured');

    const page: string = renderReport(
      savedRun({ suites: [{ id: 'adapters', title: 'Adapters', groups: [group] }], targets }),
      undefined,
    );
    expect(page).toContain(
      `- **#4 ${targetText}**: not measured: ${fresh}: failed in round 2 of 3 (earlier rounds measured): unexpected statuses`,
    );
    expect(page).toContain(
      `- Express: POST /charges: ${fresh}: failed in round 2 of 3 (earlier rounds measured): unexpected statuses`,
    );
    expect(ratioChart(targets, 'ratios')).not.toContain(targetText);
  });
});
