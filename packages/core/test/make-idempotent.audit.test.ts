// Audit of makeIdempotent at its edges: a store that fails mid-complete (the engine retries the
// completion in the background, after the wrapper has returned), and the memory store's own cap.
// The engine's clock is injected; the background retry's 100 ms timer is real and only waited for.
import { Buffer } from 'node:buffer';
import { describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { makeIdempotent } from '../src/make-idempotent.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

type Order = { id: string; amount: number };
const order = (id: string, amount = 5): Order => ({ id, amount });
const byOrder = { operation: 'processOrder', key: (m: Order) => m.id, payload: (m: Order) => JSON.stringify(m) };

// The memory store as if behind a network (not in process, so the engine retries a failed completion),
// whose first `complete` fails as a dropped connection does.
function failingOnce(store: Store): { store: Store; completes: () => number } {
  let completes = 0;
  return {
    store: {
      claim: (input) => store.claim(input),
      renew: (input) => store.renew(input),
      complete: async (input) => {
        if (++completes === 1) throw Object.assign(new Error('connection reset (injected)'), { code: 'ECONNRESET' });
        return store.complete(input);
      },
      release: (input) => store.release(input),
      get: (id) => store.get(id),
    },
    completes: () => completes,
  };
}

describe('makeIdempotent: a store that fails mid-complete', () => {
  // Was wrong: a bytes result went to the store as the handler's own buffer, not a copy. When the
  // completion failed and the engine tried it again in the background, the wrapper had already
  // handed the buffer back to its caller, who may reuse it (a pooled buffer, refilled for the next
  // message): the retried completion stored whatever it then held, and every redelivery got those
  // bytes instead of the result.
  it('a bytes result the caller reuses after it returned: the redelivery gets the bytes of the run', async () => {
    const clock = { now: 1_700_000_000_000 };
    const inner = memoryStore({ now: () => clock.now });
    const { store, completes } = failingOnce(inner);
    const engine = createIdempotency({ store, heartbeat: false, now: () => clock.now });
    let runs = 0;
    const pooled = Buffer.alloc(4);
    const handle = makeIdempotent(
      async () => {
        runs++;
        pooled.write('PAID');
        return pooled;
      },
      { engine, ...byOrder },
    );
    const first = await handle(order('o-1'));
    expect(first.toString()).toBe('PAID');
    // The caller reuses its buffer while the completion is retried in the background.
    pooled.write('XXXX');
    await vi.waitFor(() => expect(completes()).toBe(2), { timeout: 10_000 });
    const again = await handle(order('o-1'));
    expect(runs).toBe(1);
    expect(Buffer.from(again).toString()).toBe('PAID');
  });
});

describe("makeIdempotent: the memory store's cap", () => {
  // Was wrong: the memory store declared its whole budget (`maxBytes`) as its `maxResponseBytes`,
  // but counted a record's id, token and fingerprint against it besides the response, which
  // `storedResponseSize` does not. A result between the two (here 4,060 characters under a 4 KiB
  // store) passed makeIdempotent's check (and an HTTP adapter's), was refused by the store, and the
  // engine freed the key after the effect: the redelivery ran the handler again. The store now
  // refuses by `storedResponseSize` and keeps such a record a few bytes over its budget.
  it('a result within the declared cap but over what the store counts is never run twice', async () => {
    const clock = { now: 1_700_000_000_000 };
    const store = memoryStore({ maxBytes: 4096, now: () => clock.now });
    const engine = createIdempotency({ store, heartbeat: false, now: () => clock.now });
    expect(engine.settings.storeMaxResponseBytes).toBe(4096);
    let runs = 0;
    // 15 + '{"x-result":"json"}' (19) + the JSON string (4,062) = 4,096: at the declared cap.
    const handle = makeIdempotent(
      async () => {
        runs++;
        return 'x'.repeat(4060);
      },
      { engine, ...byOrder },
    );
    await handle(order('o-1')).catch(() => undefined);
    await handle(order('o-1')).catch(() => undefined);
    expect(runs).toBe(1);
  });
});
