import { memoryStore, type Store } from '@idem/core';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createReceiver, createSender, createSigner, seededRandom } from '../src/index.js';

// Audit (clocks): the sender's horizon ("no attempt starts later than this after the first one") is
// measured on its `now`, by default `Date.now`, a wall clock that an NTP step or a VM resume moves
// by hours at once. Run here with the sender's default clock and sleep under fake timers:
// `vi.setSystemTime` is the step (Date.now only), `vi.advanceTimersByTimeAsync` is time that passes.

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const T0 = Date.UTC(2026, 0, 1);
const HOUR = 3_600_000;

beforeEach(() => {
  vi.useFakeTimers({
    toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date', 'performance'],
    now: T0,
  });
});

afterEach(() => {
  vi.useRealTimers();
});

describe('the horizon when the wall clock jumps forward', () => {
  // Was a defect: the horizon check is `now() + wait - firstAt > horizonMs` on the wall clock (sender.ts, send), so a forward step of the clock during the first retry's wait dead-letters the event as past its 1 h horizon after about a second of retrying.
  it('keeps retrying an event that has been failing for seconds, not an hour', async () => {
    const starts: number[] = [];
    const fetch = (async () => {
      starts.push(performance.now());
      return new Response(null, { status: 503 });
    }) as typeof globalThis.fetch;
    const sender = createSender({
      secret: SECRET,
      fetch,
      random: seededRandom(7),
      schedule: { base: '1s', cap: '2s', horizon: '1h', maxAttempts: 4 },
    });
    let result: Awaited<ReturnType<typeof sender.send>> | undefined;
    const sending = sender.send({ url: 'https://hooks.example/in', id: 'evt_1', body: '{}' }).then((r) => {
      result = r;
    });
    await vi.advanceTimersByTimeAsync(0); // the first attempt has been answered 503
    expect(starts).toHaveLength(1);
    vi.setSystemTime(Date.now() + 2 * HOUR); // the sender's host clock jumps two hours ahead
    await vi.advanceTimersByTimeAsync(10_000); // far more than 3 waits of at most 2 s
    await sending;
    expect(performance.now() - (starts[0] as number)).toBeLessThan(HOUR);
    expect(result?.outcome).toBe('dead-letter');
    expect(result?.outcome === 'dead-letter' && result.reason).toBe('max-attempts');
    expect(starts).toHaveLength(4);
  });
});

describe('the receiver when the wall clock steps back', () => {
  // Was a defect: createReceiver handed its default `now` (Date.now) to the engine as an injected
  // clock, so the engine timed lease renewals on the wall clock: after a step back of an hour the
  // lease of an event still being applied was not renewed, the store ended it, and a redelivery of
  // the same event to another process was applied a second time.
  it('keeps renewing the lease of an event being applied, so a redelivery is not applied twice', async () => {
    const serverClock = () => T0 + performance.now();
    const inner = memoryStore({ now: serverClock });
    // A store other processes share (not in this process): the engine renews its leases.
    const store: Store = {
      claim: (input) => inner.claim(input),
      renew: (input) => inner.renew(input),
      complete: (input) => inner.complete(input),
      release: (input) => inner.release(input),
      get: (id) => inner.get(id),
    };
    let release: () => void = () => undefined;
    const applied: string[] = [];
    // Two processes of the receiver on one store; the redelivery reaches the other one.
    const [receiver, other] = [1, 2].map(() =>
      createReceiver({
        store,
        secret: SECRET,
        lease: '3s',
        apply: (event) => {
          applied.push(event.id);
          return new Promise<void>((resolve) => {
            release = resolve;
          });
        },
      }),
    ) as [ReturnType<typeof createReceiver>, ReturnType<typeof createReceiver>];
    const signer = createSigner({ secret: SECRET });
    const deliver = (to = receiver) =>
      to.handle({
        headers: signer.sign({ id: 'E1', body: '{}', timestamp: Math.floor(Date.now() / 1000) }),
        body: Buffer.from('{}'),
      });
    const first = deliver();
    await vi.advanceTimersByTimeAsync(10);
    vi.setSystemTime(Date.now() - HOUR);
    await vi.advanceTimersByTimeAsync(10_000);
    const again = await deliver(other);
    expect(again.status).not.toBe(200);
    expect(applied).toEqual(['E1']);
    release();
    expect((await first).status).toBe(200);
  });
});
