import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { memoryStore } from '../src/index.js';

// Review of memoryStore's byte budget: `bytes` must equal what the live records hold (as sizeOf
// counts them) after every path that adds, replaces or removes an entry: claim, takeover, renew,
// complete, release, expiry on read, the periodic sweep, eviction by count and by bytes.

// A small deterministic generator, so a failure replays from its seed.
function generator(seed: number) {
  let state = seed >>> 0 || 1;
  return (n: number) => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) % n;
  };
}

interface Shadow {
  token: string;
  fingerprint: string;
  responseBytes: number;
}

describe('memoryStore bytes (review)', () => {
  for (const seed of [1, 7, 42, 1234, 99_991]) {
    it(`stays equal to the live records' bytes through every path (seed ${seed})`, async () => {
      const next = generator(seed);
      let now = 1_000;
      const store = memoryStore({ maxEntries: 8, maxBytes: 1_800, now: () => now });
      const shadow = new Map<string, Shadow>();
      const ids = Array.from({ length: 24 }, (_, i) => `id-${i}${'x'.repeat(i % 5)}`);
      let tokens = 0;
      const check = async () => {
        let expected = 0;
        for (const id of ids) {
          // A read drops an expired entry, so the sum below covers exactly what the store holds.
          const record = await store.get(id);
          if (record === undefined) continue;
          const known = shadow.get(id) as Shadow;
          expect(known).toBeDefined();
          expected += id.length + known.token.length + known.fingerprint.length;
          if (record.state === 'completed') expected += known.responseBytes;
        }
        expect(store.bytes).toBe(expected);
      };
      for (let step = 0; step < 1_500; step++) {
        const id = ids[next(ids.length)] as string;
        const known = shadow.get(id);
        const op = next(10);
        if (op <= 2) {
          const token = `tok-${++tokens}${'t'.repeat(next(4))}`;
          const fingerprint = 'f'.repeat(1 + next(40));
          const current = await store.get(id);
          // Half the claims of an abandoned record name it (a takeover), half are plain claims.
          const replaces = current?.state === 'in_progress' && next(2) === 0 ? known?.token : undefined;
          const result = await store.claim({
            id,
            token,
            fingerprint,
            leaseMs: 50 + next(200),
            keepAfterLeaseMs: next(3) === 0 ? 0 : 100 + next(400),
            ...(replaces === undefined ? {} : { replaces }),
          });
          if (result.claimed) shadow.set(id, { token, fingerprint, responseBytes: 0 });
        } else if (op <= 4 && known) {
          const headers: Record<string, string> = next(2) ? { 'content-type': 'application/json' } : {};
          if (next(3) === 0) headers['x-trace'] = 'v'.repeat(next(300));
          const body = Buffer.alloc(next(700), 0x62);
          let headerBytes = 0;
          for (const name in headers) headerBytes += name.length + (headers[name] as string).length;
          const ok = await store.complete({
            id,
            token: known.token,
            response: { status: 200 + next(300), headers, body },
            retentionMs: 100 + next(2_000),
          });
          if (ok) known.responseBytes = headerBytes + body.length;
        } else if (op === 5 && known) {
          await store.renew({ id, token: known.token, leaseMs: 50 + next(300) });
        } else if (op === 6 && known) {
          await store.release({ id, token: known.token });
        } else {
          now += next(8) === 0 ? next(1_500) : next(20);
        }
        if (step % 7 === 0) await check();
      }
      await check();
      // The run went through eviction (by count and by bytes), not only claims and expiry.
      expect(store.evicted).toBeGreaterThan(0);
    });
  }
});
