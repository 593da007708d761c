// The core suite's replay row reads the rate that the same round's core.bench.ts run found. When a
// later run fails, that round has no replay figure: it must not repeat the previous round's.
import { EventEmitter } from 'node:events';
import { describe, expect, it, vi } from 'vitest';

// core.bench.ts runs, one per round: the first prints its results line, the second crashes.
const runs = [
  {
    code: 0,
    stdout: `${JSON.stringify({
      results: [
        { name: 'begin+complete (fresh keys)', wallOpsPerSecond: 300_000, opsPerSecond: 250_000 },
        { name: 'replay', wallOpsPerSecond: 900_000, opsPerSecond: 800_000 },
      ],
    })}\n`,
  },
  { code: 1, stdout: '' },
];

vi.mock('node:child_process', () => ({
  spawn: () => {
    const run = runs.shift() ?? { code: 1, stdout: '' };
    const child = Object.assign(new EventEmitter(), { stdout: new EventEmitter(), stderr: new EventEmitter() });
    setImmediate(() => {
      if (run.stdout) child.stdout.emit('data', run.stdout);
      if (run.code !== 0) child.stderr.emit('data', 'Error: the engine crashed\n');
      child.emit('exit', run.code);
    });
    return child;
  },
}));

describe('core suite', () => {
  it('gives no replay figure for a round whose run failed', async () => {
    // @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
    const { coreSuite } = await import('../suites/core.mjs');
    const { groups } = await coreSuite.run({ rounds: 2, durationSeconds: 1, quick: false }, { log: () => {} });
    const core = groups.find((group: { id: string }) => group.id === 'core');
    const [fresh, replay] = core.contenders;
    expect(fresh.samples).toEqual([300_000, null]);
    expect(replay.samples).toEqual([900_000, null]);
  });
});
