// Refused refreshes reach the operator as counted lines (refusal-log.ts): a burst that stops is still
// told, by the timer, and a code that is no OAuth code's shape is not written as it came.
import { describe, expect, it } from 'vitest';
import { refusalLogger } from '../src/app/refusal-log.js';
import { manualClock as manual } from './manual-clock.js';

const refusal = (error: string, status: number, message = 'refused') =>
  Object.assign(new Error(message), { error, status });

describe('refusalLogger', () => {
  it('writes the first refusal at once, then the ones since by the timer, a minute later', () => {
    const clock = manual();
    const lines: string[] = [];
    const log = refusalLogger({ write: (line) => lines.push(line), now: clock.now, schedule: clock.schedule });
    log.note(refusal('invalid_client', 401));
    expect(lines).toEqual([
      "third-party app: the provider refused 1 refresh (invalid_client 1; the last HTTP 401: refused); the sessions keep their tokens; is the app's client secret the provider's?",
    ]);
    for (let i = 0; i < 30; i++) log.note(refusal('invalid_client', 401));
    log.note(refusal('<script>', 429, 'slow down'));
    clock.advance(59_999);
    expect(lines).toHaveLength(1);
    clock.advance(1);
    expect(lines[1]).toBe(
      "third-party app: the provider refused 31 refreshes (invalid_client 30, other 1; the last HTTP 429: slow down); the sessions keep their tokens; is the app's client secret the provider's?",
    );
    expect(clock.pending()).toBe(0);
    // Past a quiet minute, the next one goes out at once again; no hint without invalid_client.
    clock.advance(60_000);
    log.note(refusal('invalid_scope', 400));
    expect(lines[2]).toBe(
      'third-party app: the provider refused 1 refresh (invalid_scope 1; the last HTTP 400: refused); the sessions keep their tokens',
    );
  });
});
