// Only a run that measured everything, as long as the defaults ask, may replace the published page.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { parseArgs, publishable } from '../lib/args.mjs';

const run = (...argv: string[]) => publishable(parseArgs(argv, '/repo'));

describe('publishable', () => {
  it('is a full run with the default rounds and windows, or more of them', () => {
    expect(run()).toBe(true);
    expect(run('--rounds', '5', '--duration', '3')).toBe(true);
  });

  it('is not a quick run, a run of some suites or contenders, or one with fewer rounds or shorter windows', () => {
    expect(run('--quick')).toBe(false);
    expect(run('limits')).toBe(false);
    expect(run('--match', 'replays')).toBe(false);
    expect(run('--rounds', '1')).toBe(false);
    expect(run('--rounds', '2')).toBe(false);
    expect(run('--duration', '1')).toBe(false);
  });
});
