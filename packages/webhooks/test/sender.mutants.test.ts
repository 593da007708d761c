import { describe, expect, it } from 'vitest';
import { type AttemptRecord, createSender, type SenderOptions, seededRandom } from '../src/index.js';

// Tests written by a mutation-testing pass over sender.ts: each kills a mutant the other webhook
// tests let live (named in its comment).

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const message = { url: 'https://receiver.test/hooks', id: 'evt_1', body: '{"type":"payment.succeeded"}' };

/** A sender whose endpoint answers `statuses` in turn (the last repeats), on a clock its sleep advances. */
function harness(statuses: number[], options: Partial<SenderOptions> = {}) {
  let t = Date.UTC(2026, 0, 1);
  let calls = 0;
  const told: AttemptRecord[] = [];
  const sender = createSender({
    secret: SECRET,
    fetch: (async () =>
      new Response('no', { status: statuses[Math.min(calls++, statuses.length - 1)] })) as typeof fetch,
    now: () => t,
    sleep: async (ms) => {
      t += ms;
    },
    random: seededRandom(7),
    onAttempt: (attempt) => void told.push(attempt),
    ...options,
  });
  return { sender, told };
}

describe('onAttempt (mutants)', () => {
  // Kills: the last attempt of a dead-lettered delivery (max-attempts, gone) not told.
  it('is told the last attempt of a delivery that is dead-lettered, with no wait after it', async () => {
    const failing = harness([500], { schedule: { maxAttempts: 2 } });
    expect(await failing.sender.send(message)).toMatchObject({ outcome: 'dead-letter', reason: 'max-attempts' });
    expect(failing.told.map((a) => [a.attempt, a.waitMs])).toEqual([
      [1, expect.any(Number)],
      [2, undefined],
    ]);
    const gone = harness([410]);
    expect(await gone.sender.send(message)).toMatchObject({ outcome: 'dead-letter', reason: 'gone' });
    expect(gone.told.map((a) => [a.attempt, a.result, a.waitMs])).toEqual([[1, 'gone', undefined]]);
  });

  // Kills: the attempt that a wait past the horizon ends not told.
  it('is told the attempt after which the next wait would pass the horizon', async () => {
    const { sender, told } = harness([500], {
      random: () => 0.999,
      schedule: { base: '10s', cap: '10s', horizon: '5s', maxAttempts: 5 },
    });
    expect(await sender.send(message)).toMatchObject({ outcome: 'dead-letter', reason: 'horizon' });
    expect(told.map((a) => [a.attempt, a.waitMs])).toEqual([[1, undefined]]);
  });

  // Kills: the observer handed the record itself, not its own copy.
  it('gets its own copy: an observer that edits it changes nothing in the result', async () => {
    const { sender } = harness([500, 200], {
      onAttempt: (attempt) => {
        attempt.status = 999;
        attempt.waitMs = -1;
      },
    });
    const result = await sender.send(message);
    expect(result.attempts.map((a) => [a.status, a.waitMs === -1])).toEqual([
      [500, false],
      [200, false],
    ]);
  });

  // Kills: sender.attempt() (the one a relay calls) no longer telling onAttempt.
  it('is told the one attempt sender.attempt() makes', async () => {
    const { sender, told } = harness([503]);
    const record = await sender.attempt(message, 3);
    expect(told).toEqual([record]);
    expect(told[0]).not.toBe(record);
  });
});
