// Audit (queue consumers): a delivery that waits (`wait`) for a key in progress and then claims it
// (the holder crashed and its lease ran out, or it released the key) gets a lease of its own that is
// as fresh as its claim. Found with RabbitMQ: a consumer killed mid-handler, its message redelivered
// at once to another consumer whose engine waits longer than the lease; the takeover's handler ran
// with its signal already aborted (a `lease-lost` event, reason `renew-failed`), since the new lease
// was dated from when begin() started waiting, over a lease before its claim.
import { createIdempotency, type IdempotencyEvent, memoryStore, type Store } from '@idem/core';
import { describe, expect, it } from 'vitest';

// The memory store behind a network, as the engine sees it: a lease is then watched by its clock.
function sharedStore(now: () => number): Store {
  return { ...memoryStore({ now }), inProcess: false };
}

/** Resolves once `check` holds, giving the engine's poll timers their turns. */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 1));
  expect(check()).toBe(true);
}

describe('a claim made after waiting longer than a lease', () => {
  it('takes over a crashed holder with a live lease: its signal is not aborted, no lease-lost', async () => {
    let t = 1_000_000;
    const now = () => t;
    const store = sharedStore(now);
    const crashed = createIdempotency({ store, now, lease: '1s', heartbeat: false });
    const first = await crashed.begin({ key: 'msg-1', scope: '', operation: 'consume' });
    expect(first.kind).toBe('execute');

    const events: IdempotencyEvent[] = [];
    const survivor = createIdempotency({ store, now, lease: '1s', wait: '5s', onEvent: (e) => events.push(e) });
    let polls = 0;
    const get = store.get.bind(store);
    store.get = (id) => {
      polls++;
      return get(id);
    };
    const waiting = survivor.begin({ key: 'msg-1', scope: '', operation: 'consume' });
    await until(() => polls > 0);
    // The crashed holder's lease runs out while the redelivery waits.
    t += 1_500;
    const started = await waiting;
    expect(started.kind).toBe('execute');
    if (started.kind !== 'execute') return;
    expect(started.lease.recovered).toBe(true);
    expect(started.lease.signal.aborted).toBe(false);
    expect(started.lease.lost).toBe(false);
    expect(events.filter((e) => e.type === 'lease-lost')).toEqual([]);
    expect((await survivor.complete(started.lease, { status: 200, headers: {}, body: new Uint8Array() })).ok).toBe(
      true,
    );
  });

  it('claims a key its holder released: maxExecution counts from the claim, not from the wait', async () => {
    let t = 1_000_000;
    const now = () => t;
    const store = sharedStore(now);
    const holder = createIdempotency({ store, now, lease: '10s', heartbeat: false });
    const first = await holder.begin({ key: 'msg-2', scope: '', operation: 'consume' });
    if (first.kind !== 'execute') throw new Error('the first claim must execute');

    const events: IdempotencyEvent[] = [];
    const waiter = createIdempotency({
      store,
      now,
      lease: '10s',
      wait: '30s',
      maxExecution: '5s',
      onEvent: (e) => events.push(e),
    });
    let polls = 0;
    const get = store.get.bind(store);
    store.get = (id) => {
      polls++;
      return get(id);
    };
    const waiting = waiter.begin({ key: 'msg-2', scope: '', operation: 'consume' });
    await until(() => polls > 0);
    // Twelve seconds of waiting, then the holder lets go (its run had no effect).
    t += 12_000;
    expect((await holder.release(first.lease)).ok).toBe(true);
    const started = await waiting;
    expect(started.kind).toBe('execute');
    if (started.kind !== 'execute') return;
    expect(started.lease.signal.aborted).toBe(false);
    expect(events.filter((e) => e.type === 'lease-lost')).toEqual([]);
    await waiter.release(started.lease);
  });
});
