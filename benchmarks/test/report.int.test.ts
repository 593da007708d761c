// A run on a box much slower than research/perf-limits.md's says so at the top of its page, from
// its own node:http limit, so its ratios are not read as the reference box's.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { renderReport } from '../lib/report.mjs';
import { row, savedRun } from './fixtures.js';

// A results object with only the limits group, whose node:http row served `nodeHttp` req/s.
function results(nodeHttp: number) {
  return savedRun({
    suites: [
      {
        title: 'Limits',
        groups: [
          {
            id: 'limits-http',
            title: 'HTTP limit',
            unit: 'req/s',
            baseline: 'node:http',
            contenders: [row('node:http', nodeHttp), row('bare fastify', nodeHttp * 0.9)],
          },
        ],
      },
    ],
  });
}

describe('the benchmark page', () => {
  it('warns when node:http ran well below the reference box, and only then', () => {
    const slow: string = renderReport(results(13_609), undefined);
    expect(slow).toContain(
      '**This box was slower than the reference box.** Bare node:http served 13,609 requests per second here, 27% of the 49,920',
    );
    // At 70% of the reference and above, the box counts as the reference's kind.
    for (const rate of [34_944, 46_198, 52_000]) {
      expect(renderReport(results(rate), undefined)).not.toContain('slower than the reference box');
    }
    expect(renderReport(results(34_943), undefined)).toContain('slower than the reference box');
  });

  it('says nothing of the box when the run did not measure the limits', () => {
    const page: string = renderReport({ ...results(1), suites: [] }, undefined);
    expect(page).not.toContain('slower than the reference box');
  });
});
