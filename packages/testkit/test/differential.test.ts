// The differential test of the three adapters on memory stores, with time moving past the retention
// (see differential.ts).
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Differential, startDifferential } from './differential.js';

// One clock for the three stores: an `advance` step moves them at once.
let clock = Date.UTC(2026, 0, 1);
let run: Differential;

beforeAll(async () => {
  run = await startDifferential({
    store: () => memoryStore({ now: () => clock }),
    now: () => clock,
    advance: (ms) => {
      clock += ms;
    },
    numRuns: 150,
  });
}, 30_000);

afterAll(async () => {
  await run?.close();
});

describe('the three adapters against one model of the spec, on memory stores', () => {
  it('answer every generated sequence as the model says, and alike, time moving past the retention, expiry advertised', async () => {
    const figures = await run.check();
    expect(figures.requests).toBeGreaterThan(1000);
    console.info(`[figures] differential memory ${JSON.stringify(figures)}`);
  }, 120_000);
});
