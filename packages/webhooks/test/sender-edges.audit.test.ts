// Edges of the sender that a mutation pass found untested: each test kills a mutant every other
// webhook test let live (named in its comment).
import { describe, expect, it } from 'vitest';
import { createSender } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const START = Date.UTC(2026, 0, 1);
const message = { url: 'https://receiver.test/hooks', id: 'evt_1', body: '{"type":"payment.succeeded"}' };

describe('sender edges (mutants)', () => {
  // Kills: the signed timestamp rounded rather than floored. Rounded, an attempt made in the second
  // half of a second is signed one second ahead of the sender's clock, and a receiver with a
  // one-second future tolerance and a clock a little behind refuses it as timestamp_too_new.
  it('signs the second the attempt is in, never the next one', async () => {
    const stamps: string[] = [];
    const sender = createSender({
      secret: SECRET,
      fetch: (async (_url: string | URL, init: RequestInit = {}) => {
        stamps.push((init.headers as Record<string, string>)['webhook-timestamp'] as string);
        return new Response(null, { status: 204 });
      }) as typeof globalThis.fetch,
    });
    for (const offset of [0, 499, 500, 999]) await sender.attempt(message, 1, { now: () => START + offset });
    expect(stamps).toEqual(Array(4).fill(String(START / 1000)));
  });

  // Kills: the horizon check refusing an attempt that would start exactly at the horizon. "No
  // attempt starts after it" (docs/webhooks.md): one at the horizon is not after it, and the
  // outbox's own rule (SQL, `next > horizon end`) sends it.
  it('makes an attempt that starts exactly at the horizon', async () => {
    let t = START;
    const calls: number[] = [];
    const sender = createSender({
      secret: SECRET,
      now: () => t,
      random: () => 0,
      sleep: async (ms) => {
        t += ms;
      },
      schedule: { horizon: '4s' },
      fetch: (async () => {
        calls.push(t - START);
        return calls.length === 1
          ? new Response(null, { status: 503, headers: { 'retry-after': '4' } })
          : new Response(null, { status: 200 });
      }) as typeof globalThis.fetch,
    });
    expect((await sender.send(message)).outcome).toBe('delivered');
    expect(calls).toEqual([0, 4000]);
  });
});
