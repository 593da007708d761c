// Documentation claims of docs/webhooks.md checked against the receiver (docs audit of 2026-12):
// true claims that no test held.
import { memoryStore } from '@idem/core';
import { describe, expect, it, vi } from 'vitest';
import { createReceiver, createSigner, type ReceiverEvent } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const paymentBody = JSON.stringify({ type: 'payment.succeeded', data: { id: 'pay_1', amount: 4200 } });

describe('docs/webhooks.md: a hung apply', () => {
  // docs/webhooks.md, "A hung apply": "An apply that finishes after that is not recorded; one that
  // finishes before any retry came is recorded, since nobody took the event over."
  it('an apply that outlives maxExecution and its lease, with no retry meanwhile, is recorded: the retry is a duplicate', async () => {
    vi.useFakeTimers();
    try {
      const store = memoryStore({ now: () => Date.now() });
      const events: ReceiverEvent[] = [];
      let applies = 0;
      let settle!: () => void;
      const receiver = createReceiver({
        store,
        secret: SECRET,
        lease: '1s',
        maxExecution: '3s',
        onEvent: (event) => events.push(event),
        apply: () => {
          applies++;
          return new Promise<void>((resolve) => (settle = resolve));
        },
      });
      const deliver = () => {
        const headers = signer.sign({ id: 'E-slow', body: paymentBody, timestamp: Math.floor(Date.now() / 1000) });
        return receiver.handle({ headers, body: Buffer.from(paymentBody) });
      };
      const first = deliver();
      await vi.advanceTimersByTimeAsync(10);
      // Past maxExecution (3 s) and one lease more (1 s): the claim is no longer held, but nobody took it.
      await vi.advanceTimersByTimeAsync(5_000);
      settle();
      expect(await first).toMatchObject({ status: 200, outcome: 'applied' });
      expect(events.some((event) => event.type === 'record-failed')).toBe(false);
      const retry = await deliver();
      expect(retry).toMatchObject({ status: 200, outcome: 'duplicate' });
      expect(applies).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });

  // The same paragraph's first half, with "record-failed" (Events): a late apply after a retry took the
  // event over is not recorded; without transactions it is still acknowledged, with a record-failed event.
  it('an apply that finishes after a retry took the event over is not recorded: record-failed, lease-lost', async () => {
    vi.useFakeTimers();
    try {
      const store = memoryStore({ now: () => Date.now() });
      const events: ReceiverEvent[] = [];
      const settles: Array<() => void> = [];
      const receiver = createReceiver({
        store,
        secret: SECRET,
        lease: '1s',
        maxExecution: '3s',
        onEvent: (event) => events.push(event),
        apply: () => new Promise<void>((resolve) => settles.push(resolve)),
      });
      const deliver = () => {
        const headers = signer.sign({ id: 'E-late', body: paymentBody, timestamp: Math.floor(Date.now() / 1000) });
        return receiver.handle({ headers, body: Buffer.from(paymentBody) });
      };
      const first = deliver();
      await vi.advanceTimersByTimeAsync(5_000);
      const retry = deliver();
      await vi.advanceTimersByTimeAsync(10);
      expect(settles).toHaveLength(2);
      settles[0]?.();
      expect(await first).toMatchObject({ status: 200, outcome: 'applied' });
      expect(events).toContainEqual(
        expect.objectContaining({ type: 'record-failed', id: 'E-late', reason: 'lease-lost' }),
      );
      settles[1]?.();
      expect(await retry).toMatchObject({ status: 200, outcome: 'applied' });
    } finally {
      vi.useRealTimers();
    }
  });
});
