import { randomBytes, randomUUID } from 'node:crypto';
import {
  createIdempotency,
  type IdempotencyEvent,
  isResponseTooLargeError,
  recordId,
  type Store,
  type StoredResponse,
  type StoreRecord,
  storedResponseSize,
} from '@idem/core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

/**
 * What a store's test file gives {@link describeStore}: the store, and a way to make a record's
 * lease or retention run out *now*, as the store's own clock would, so no test sleeps out a TTL.
 */
export interface StoreHarness {
  store: Store;
  /** Makes the live record `id` expire now (Redis: PEXPIRE/DEL; SQL: move its expiry into the past; memory: advance the clock). */
  expire(id: string): Promise<void>;
  /** Remaining lifetime of record `id` in ms as the store measures it, if the store can tell. Enables the duration checks. */
  ttl?(id: string): Promise<number | undefined>;
  /**
   * For a store on a clock the test controls (the memory store's `now`): moves that clock forward by
   * `ms`. Enables the duration checks for a store that cannot tell a record's `ttl`. A harness with
   * neither has those checks reported as skipped.
   */
  advance?(ms: number): Promise<void>;
  /**
   * Makes the lease of record `id` (in progress, claimed or last renewed with `leaseMs`) run out now,
   * as if its holder had crashed one lease ago: the store keeps the record abandoned for its
   * `keepAfterLeaseMs` (Redis: PEXPIRE to that; SQL: move the lease's end into the past; memory:
   * advance the clock by `leaseMs`). Enables the abandoned-record checks; a harness without it has
   * them reported as skipped.
   */
  endLease?(id: string, leaseMs: number): Promise<void>;
  /**
   * For a store with a size cap: the same store (same backend, same records) with its
   * `maxResponseBytes` set to `maxBytes`. Enables the size cap checks: a response over the cap,
   * as `storedResponseSize` measures it, is refused with `ResponseTooLargeError` and nothing is
   * written; one of exactly the cap is stored.
   */
  makeCapped?(maxBytes: number): Store | Promise<Store>;
  /**
   * A store made afresh over the same backend (same records), as a restarted process makes it.
   * Enables the check that what one instance wrote, another reads back exactly; a harness without it
   * has that check reported as skipped.
   */
  reopen?(): Store | Promise<Store>;
  close?(): Promise<void>;
}

/** Options of {@link describeStore}. */
export interface DescribeStoreOptions {
  /** Concurrent claims in the race test. Default 50. */
  concurrency?: number | undefined;
  /** Size of the large body round trip. Default 1 MiB. */
  largeBodyBytes?: number | undefined;
  /**
   * Whether the store keeps a response's reason phrase (`StoredResponse.statusMessage`). Default
   * true: it is given back with the record, and a response without one reads back without one. False
   * for a store that drops it: its records must then come back without any phrase, never another's.
   */
  keepsStatusMessage?: boolean | undefined;
}

const response = (body: Uint8Array, status = 201, headers: Record<string, string> = {}): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/octet-stream', ...headers },
  body,
});

// A store call that must throw (or reject with) a TypeError, whether the store throws at the call or
// rejects the promise it returns.
const refused = async (call: () => unknown) => {
  let thrown: unknown;
  try {
    await call();
  } catch (error) {
    thrown = error;
  }
  expect(thrown).toBeInstanceOf(TypeError);
};

const freshId = () => recordId(`scope-${randomUUID()}`, 'POST /charges', randomUUID());

// Durations of the duration checks. None is a default of the engine (10 s lease, 24 h retention) or a
// round figure a store might hard-code: a store that ignores the one it is given cannot pass by luck.
const leaseMs = 7_300;
const renewedLeaseMs = 41_000;
const retentionMs = 3 * 3_600_000 + 7 * 60_000;
const keepMs = 5 * 3_600_000 + 11 * 60_000;
// Slack for the time the checks themselves take on a slow machine.
const slackMs = 2_000;
// Upper bounds allow one millisecond: a store's clock read twice may step back by that much (PGlite's
// clock_timestamp() in WebAssembly did: a TTL 1 ms over the lease just set).
const tickMs = 1;

// Changes everything a caller could change in a record it was handed. A store may hand out frozen
// records instead of copies: a change that throws has changed nothing, which is just as good.
const scribbleOn = (record: StoreRecord | undefined) => {
  const attempt = (change: () => void) => {
    try {
      change();
    } catch {}
  };
  if (record === undefined) return;
  const writable = record as { -readonly [K in keyof StoreRecord]: StoreRecord[K] };
  attempt(() => {
    writable.token = 'changed';
  });
  attempt(() => {
    writable.fingerprint = 'changed';
  });
  if (record.state !== 'completed') return;
  const stored = record.response as { -readonly [K in keyof StoredResponse]: StoredResponse[K] };
  attempt(() => record.response.body.fill(0x78));
  attempt(() => {
    stored.headers['content-type'] = 'text/plain';
  });
  attempt(() => {
    stored.headers['set-cookie'] = 'sid=added-by-a-reader';
  });
  attempt(() => {
    stored.status = 500;
  });
};

/**
 * The conformance suite every idem {@link Store} passes. Call it from a vitest file:
 *
 * @example
 * import { describeStore } from '@idem/testkit';
 * describeStore('my store', async () => ({
 *   store: myStore(client),
 *   expire: (id) => client.expireNow(id),
 * }));
 */
export function describeStore(
  name: string,
  makeHarness: () => Promise<StoreHarness>,
  options: DescribeStoreOptions = {},
): void {
  const concurrency = options.concurrency ?? 50;
  const largeBodyBytes = options.largeBodyBytes ?? 1024 * 1024;
  const keepsStatusMessage = options.keepsStatusMessage ?? true;

  describe(`Store contract: ${name}`, () => {
    let harness: StoreHarness;
    let store: Store;
    beforeAll(async () => {
      harness = await makeHarness();
      store = harness.store;
    });
    afterAll(async () => {
      await harness?.close?.();
    });

    it('claims an unseen id and reports it in progress with its token and fingerprint', async () => {
      const id = freshId();
      expect(await store.get(id)).toBeUndefined();
      expect(await store.claim({ id, token: 't1', fingerprint: 'fp1', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't1', fingerprint: 'fp1' });
    });

    it(`gives exactly one winner among ${concurrency} parallel claims of one id`, async () => {
      const id = freshId();
      const results = await Promise.all(
        Array.from({ length: concurrency }, (_, i) =>
          store.claim({ id, token: `t${i}`, fingerprint: 'fp', leaseMs: 5_000 }),
        ),
      );
      const winners = results.flatMap((result, i) => (result.claimed ? [i] : []));
      expect(winners).toHaveLength(1);
      for (const result of results) {
        if (result.claimed) continue;
        expect(result.record.state).toBe('in_progress');
        expect(result.record.token).toBe(`t${winners[0]}`);
      }
    });

    it(`gives exactly one winner among ${concurrency} parallel claims of an expired id: an ended lease, an ended retention`, async () => {
      // Retries that arrive after a lease or a retention ran out race just as first attempts do; a
      // store whose insert of a new id is atomic but that reads an expired record, then overwrites it,
      // lets every one of them run the handler.
      for (const ended of ['lease', 'retention'] as const) {
        const id = freshId();
        await store.claim({ id, token: 'old', fingerprint: 'fp', leaseMs: 5_000 });
        if (ended === 'retention') {
          await store.complete({ id, token: 'old', response: response(new Uint8Array([1])), retentionMs: 60_000 });
        }
        await harness.expire(id);
        const results = await Promise.all(
          Array.from({ length: concurrency }, (_, i) =>
            store.claim({ id, token: `t${i}`, fingerprint: 'fp', leaseMs: 5_000 }),
          ),
        );
        expect(
          results.filter((result) => result.claimed),
          `winners among claims of an id whose ${ended} ended (claim must be one atomic step)`,
        ).toHaveLength(1);
      }
    });

    it('renews a live lease only with the current token', async () => {
      const id = freshId();
      await store.claim({ id, token: 'current', fingerprint: '', leaseMs: 5_000 });
      expect(await store.renew({ id, token: 'stale', leaseMs: 5_000 })).toBe(false);
      expect(await store.renew({ id, token: 'current', leaseMs: 5_000 })).toBe(true);
      expect(await store.renew({ id: freshId(), token: 'current', leaseMs: 5_000 })).toBe(false);
      await store.complete({ id, token: 'current', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      expect(await store.renew({ id, token: 'current', leaseMs: 5_000 })).toBe(false);
    });

    it('refuses complete and release with a stale token and leaves the record unchanged', async () => {
      const id = freshId();
      await store.claim({ id, token: 'current', fingerprint: 'fp', leaseMs: 5_000 });
      expect(
        await store.complete({ id, token: 'stale', response: response(new Uint8Array([9])), retentionMs: 60_000 }),
      ).toBe(false);
      expect(await store.release({ id, token: 'stale' })).toBe(false);
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'current', fingerprint: 'fp' });
    });

    it('completes once, then replays the stored response to every later claim', async () => {
      const id = freshId();
      await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      const stored = response(new TextEncoder().encode('{"id":"ch_1"}'), 201, {
        'content-type': 'application/json',
        location: '/charges/ch_1',
      });
      expect(await store.complete({ id, token: 'a', response: stored, retentionMs: 60_000 })).toBe(true);
      expect(
        await store.complete({ id, token: 'a', response: response(new Uint8Array([0])), retentionMs: 60_000 }),
      ).toBe(false);
      const again = await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs: 5_000 });
      expect(again.claimed).toBe(false);
      if (again.claimed) return;
      expect(again.record.state).toBe('completed');
      if (again.record.state !== 'completed') return;
      expect(again.record.fingerprint).toBe('fp');
      expect(again.record.response.status).toBe(201);
      expect(again.record.response.headers).toEqual(stored.headers);
      expect(Buffer.from(again.record.response.body).toString()).toBe('{"id":"ch_1"}');
      expect(
        await store.release({ id, token: 'a' }),
        'release() of a completed record, even with its token: it must refuse and keep the outcome',
      ).toBe(false);
    });

    // Node writes a head in Latin-1: a phrase or header value with characters U+0080..U+00FF is
    // replayed as its first answer only when the store gives back those very characters (not their
    // UTF-8 bytes read as Latin-1, nor the other way round), to a store made after a restart too.
    it('gives back a reason phrase and header values with characters U+0080..U+00FF exactly, to this store and to one made afresh', async ({
      skip,
    }) => {
      const latin1 = Array.from({ length: 128 }, (_, i) => String.fromCharCode(0x80 + i)).join('');
      const statusMessage = `Créé ${latin1}`;
      const headers = {
        'content-type': 'application/json; profile="reçu"',
        location: '/charges/café',
        link: `</charges>; title="${latin1}"`,
        etag: '"v-é"',
        'x-region': 'Zürich ± ÿ',
      };
      const id = freshId();
      await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      const written: StoredResponse = { status: 201, headers, body: Buffer.from('{"n":"é"}'), statusMessage };
      expect(await store.complete({ id, token: 'a', response: written, retentionMs: 60_000 })).toBe(true);
      const read = (record: StoreRecord | undefined) =>
        record?.state === 'completed'
          ? {
              statusMessage: record.response.statusMessage,
              headers: record.response.headers,
              body: Buffer.from(record.response.body).toString('hex'),
            }
          : record?.state;
      const expected = {
        statusMessage: keepsStatusMessage ? statusMessage : undefined,
        headers,
        body: Buffer.from('{"n":"é"}').toString('hex'),
      };
      expect(read(await store.get(id))).toEqual(expected);
      if (harness.reopen === undefined) return skip('the harness has no reopen()');
      const fresh = await harness.reopen();
      expect(read(await fresh.get(id))).toEqual(expected);
      const again = await fresh.claim({ id, token: 'b', fingerprint: 'fp', leaseMs: 5_000 });
      expect(again.claimed ? 'claimed' : read(again.record)).toEqual(expected);
    });

    it("keeps a reason phrase of the handler's own and gives it back with the record; a response without one reads back without one", async () => {
      const phraseOf = (record: StoreRecord | undefined) =>
        record?.state === 'completed' ? [record.response.status, record.response.statusMessage] : record?.state;
      const replayOf = async (id: string) => {
        const again = await store.claim({ id, token: 'reader', fingerprint: 'fp', leaseMs: 5_000 });
        return again.claimed ? 'claimed' : phraseOf(again.record);
      };
      const own = freshId();
      await store.claim({ id: own, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      const withPhrase = { ...response(new Uint8Array([1])), statusMessage: 'Created Fine' };
      expect(await store.complete({ id: own, token: 'a', response: withPhrase, retentionMs: 60_000 })).toBe(true);
      const kept = keepsStatusMessage ? 'Created Fine' : undefined;
      expect(phraseOf(await store.get(own))).toEqual([201, kept]);
      expect(await replayOf(own)).toEqual([201, kept]);

      const plain = freshId();
      await store.claim({ id: plain, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      await store.complete({ id: plain, token: 'a', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      const record = await store.get(plain);
      expect(record?.state === 'completed' && 'statusMessage' in record.response).toBe(false);

      // A record that goes and is claimed again keeps nothing of the last answer's phrase.
      await harness.expire(own);
      expect(await store.claim({ id: own, token: 'b', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      const next = response(new Uint8Array([2]), 200);
      expect(await store.complete({ id: own, token: 'b', response: next, retentionMs: 60_000 })).toBe(true);
      expect(phraseOf(await store.get(own))).toEqual([200, undefined]);
      expect(await replayOf(own)).toEqual([200, undefined]);
    });

    it('stores the response as it was at completion: the caller reusing its buffer or headers changes no replay', async () => {
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      const body = new TextEncoder().encode('{"id":"ch_1"}');
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      await store.complete({ id, token: 't', response: { status: 201, headers, body }, retentionMs: 60_000 });
      body.fill(0x78);
      headers['content-type'] = 'text/plain';
      headers.extra = 'added later';
      for (let read = 0; read < 2; read++) {
        const record = await store.get(id);
        expect(record?.state).toBe('completed');
        if (record?.state !== 'completed') return;
        expect(Buffer.from(record.response.body).toString()).toBe('{"id":"ch_1"}');
        expect(record.response.headers).toEqual({ 'content-type': 'application/json' });
      }
    });

    it('keeps bodies byte for byte: every byte value, empty, and a large random body', async () => {
      const every = new Uint8Array(256).map((_, i) => i);
      const large = new Uint8Array(randomBytes(largeBodyBytes));
      for (const body of [every, new Uint8Array(0), large]) {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({
          id,
          token: 't',
          response: response(body, 200, { etag: '"v1"', link: '</a>; rel="next", </b>; rel="prev"' }),
          retentionMs: 60_000,
        });
        const record = await store.get(id);
        expect(record?.state).toBe('completed');
        if (record?.state !== 'completed') return;
        expect(record.response.body).toBeInstanceOf(Uint8Array);
        expect(Buffer.from(record.response.body).equals(Buffer.from(body))).toBe(true);
        expect(record.response.headers.link).toBe('</a>; rel="next", </b>; rel="prev"');
        expect(record.response.headers.etag).toBe('"v1"');
      }
    });

    it('stores exactly the bytes of a view into a larger buffer, not the buffer around it', async () => {
      // Buffers from Node's pool and subarrays share an ArrayBuffer with other data: a store that
      // keeps `body.buffer` instead of the view's bytes would replay someone else's bytes.
      const slab = Buffer.from('xxxxxxxxhello-worldyyyyyyyy');
      const views: Uint8Array[] = [
        slab.subarray(8, 19),
        new Uint8Array(slab.buffer, slab.byteOffset + 3, 4),
        Buffer.from('pooled'),
        new Uint8Array(new ArrayBuffer(64), 60, 0),
      ];
      for (const body of views) {
        const expected = Buffer.from(body);
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        expect(await store.complete({ id, token: 't', response: response(body), retentionMs: 60_000 })).toBe(true);
        const record = await store.get(id);
        expect(record?.state).toBe('completed');
        if (record?.state !== 'completed') return;
        expect(Buffer.from(record.response.body).equals(expected)).toBe(true);
      }
    });

    it('hands every reader its own record: changing one returned by get or claim changes no later read', async () => {
      const id = freshId();
      await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      scribbleOn(await store.get(id));
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'a', fingerprint: 'fp' });
      const refused = await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs: 5_000 });
      expect(refused.claimed).toBe(false);
      if (!refused.claimed) scribbleOn(refused.record);
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'a', fingerprint: 'fp' });

      const headers = { 'content-type': 'application/json', location: '/charges/ch_1' };
      const stored = response(new TextEncoder().encode('{"id":"ch_1"}'), 201, headers);
      await store.complete({ id, token: 'a', response: stored, retentionMs: 60_000 });
      // A replay decorated, redacted or decoded in place by one caller must not reach the next.
      for (const read of [
        () => store.get(id),
        async () => {
          const again = await store.claim({ id, token: 'c', fingerprint: 'fp', leaseMs: 5_000 });
          return again.claimed ? undefined : again.record;
        },
      ]) {
        scribbleOn(await read());
        const later = await store.get(id);
        expect(later?.state).toBe('completed');
        if (later?.state !== 'completed') return;
        expect([later.token, later.fingerprint, later.response.status]).toEqual(['a', 'fp', 201]);
        expect(later.response.headers).toEqual(stored.headers);
        expect(Buffer.from(later.response.body).toString()).toBe('{"id":"ch_1"}');
      }
    });

    it('refuses renew and complete on an id never claimed, released, or expired, and creates no record', async () => {
      // A late finisher, or a heartbeat after the lease ran out, must not bring a record back: the
      // key is free, and a retry may already be running it again.
      const done = () => response(new Uint8Array([1]));
      const never = freshId();
      expect(await store.renew({ id: never, token: 't', leaseMs: 5_000 })).toBe(false);
      expect(await store.complete({ id: never, token: 't', response: done(), retentionMs: 60_000 })).toBe(false);
      expect(await store.release({ id: never, token: 't' })).toBe(false);
      expect(await store.get(never)).toBeUndefined();

      const released = freshId();
      await store.claim({ id: released, token: 't', fingerprint: '', leaseMs: 5_000 });
      expect(await store.release({ id: released, token: 't' })).toBe(true);
      expect(await store.renew({ id: released, token: 't', leaseMs: 5_000 })).toBe(false);
      expect(await store.complete({ id: released, token: 't', response: done(), retentionMs: 60_000 })).toBe(false);
      expect(await store.get(released)).toBeUndefined();

      for (const late of ['renew', 'complete'] as const) {
        const expired = freshId();
        await store.claim({ id: expired, token: 't', fingerprint: '', leaseMs: 5_000 });
        await harness.expire(expired);
        const answer =
          late === 'renew'
            ? await store.renew({ id: expired, token: 't', leaseMs: 5_000 })
            : await store.complete({ id: expired, token: 't', response: done(), retentionMs: 60_000 });
        expect(answer).toBe(false);
        expect(await store.get(expired)).toBeUndefined();
      }
      expect(await store.claim({ id: released, token: 'next', fingerprint: '', leaseMs: 5_000 })).toEqual({
        claimed: true,
      });
    });

    it('forgets a released id, so the next claim runs with a new token', async () => {
      const id = freshId();
      await store.claim({ id, token: 'first', fingerprint: '', leaseMs: 5_000 });
      expect(await store.release({ id, token: 'first' })).toBe(true);
      expect(await store.get(id)).toBeUndefined();
      expect(await store.claim({ id, token: 'second', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await store.release({ id, token: 'first' })).toBe(false);
    });

    it('lets an expired lease be taken over with a new token, and fences the old holder', async () => {
      const id = freshId();
      await store.claim({ id, token: 'old', fingerprint: 'fp', leaseMs: 5_000 });
      await harness.expire(id);
      expect(await store.claim({ id, token: 'new', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await store.renew({ id, token: 'old', leaseMs: 5_000 })).toBe(false);
      expect(
        await store.complete({ id, token: 'old', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
      ).toBe(false);
      expect(await store.release({ id, token: 'old' })).toBe(false);
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'new', fingerprint: 'fp' });
      expect(
        await store.complete({ id, token: 'new', response: response(new Uint8Array([2])), retentionMs: 60_000 }),
      ).toBe(true);
    });

    it('forgets a completed record when its retention ends', async () => {
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      await harness.expire(id);
      expect(await store.get(id)).toBeUndefined();
      expect(await store.claim({ id, token: 'u', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
    });

    describe('forget (optional): an operator deletes a record by its token, whatever its state', () => {
      const noForget = 'the store has no forget';
      // Bound here, not read once in beforeAll: the harness (and so the store) is made there.
      const forget = (input: { id: string; token: string }) => {
        if (store.forget === undefined) throw new Error(noForget);
        return store.forget(input);
      };

      it('forgets a completed record with its token, so the next claim runs afresh', async ({ skip }) => {
        if (store.forget === undefined) return skip(noForget);
        const id = freshId();
        await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
        await store.complete({ id, token: 'a', response: response(new Uint8Array([5]), 500), retentionMs: 60_000 });
        expect(await forget({ id, token: 'a' })).toBe(true);
        expect(await store.get(id)).toBeUndefined();
        expect(await forget({ id, token: 'a' }), 'a second forget: the record is gone').toBe(false);
        expect(await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp' });
      });

      it("refuses a token that is not the record's, and keeps the record as it was", async ({ skip }) => {
        if (store.forget === undefined) return skip(noForget);
        const done = freshId();
        await store.claim({ id: done, token: 'current', fingerprint: 'fp', leaseMs: 5_000 });
        await store.complete({
          id: done,
          token: 'current',
          response: response(new Uint8Array([7])),
          retentionMs: 60_000,
        });
        const running = freshId();
        await store.claim({ id: running, token: 'current', fingerprint: 'fp', leaseMs: 5_000 });
        // A prefix of the token, and the token with more after it, are other tokens too.
        for (const token of ['other', 'curr', 'current2', '"current"']) {
          expect(await forget({ id: done, token }), `forget of a completed record with token ${token}`).toBe(false);
          expect(await forget({ id: running, token }), `forget of a record in progress with token ${token}`).toBe(
            false,
          );
        }
        const kept = await store.get(done);
        expect(kept).toMatchObject({ state: 'completed', token: 'current', fingerprint: 'fp' });
        if (kept?.state === 'completed') expect([...kept.response.body]).toEqual([7]);
        expect(await store.get(running)).toEqual({ state: 'in_progress', token: 'current', fingerprint: 'fp' });
      });

      it('answers false for an id never claimed, or expired, and creates no record', async ({ skip }) => {
        if (store.forget === undefined) return skip(noForget);
        const never = freshId();
        expect(await forget({ id: never, token: 't' })).toBe(false);
        expect(await store.get(never)).toBeUndefined();
        const expired = freshId();
        await store.claim({ id: expired, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id: expired, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 });
        await harness.expire(expired);
        expect(await forget({ id: expired, token: 't' })).toBe(false);
        expect(await store.claim({ id: expired, token: 'u', fingerprint: '', leaseMs: 5_000 })).toEqual({
          claimed: true,
        });
      });

      it('forgets a record in progress with its token: a new claim runs, and the old holder is fenced', async ({
        skip,
      }) => {
        if (store.forget === undefined) return skip(noForget);
        const id = freshId();
        await store.claim({ id, token: 'hung', fingerprint: 'fp', leaseMs: 5_000 });
        expect(await forget({ id, token: 'hung' })).toBe(true);
        expect(await store.get(id)).toBeUndefined();
        expect(await store.claim({ id, token: 'retry', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await store.renew({ id, token: 'hung', leaseMs: 5_000 })).toBe(false);
        expect(
          await store.complete({ id, token: 'hung', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
        ).toBe(false);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'retry', fingerprint: 'fp' });
      });

      it('refuses the token of a record that was taken over since (expired, then claimed afresh)', async ({ skip }) => {
        if (store.forget === undefined) return skip(noForget);
        const id = freshId();
        await store.claim({ id, token: 'old', fingerprint: 'fp', leaseMs: 5_000 });
        await store.complete({ id, token: 'old', response: response(new Uint8Array([1])), retentionMs: 60_000 });
        await harness.expire(id);
        expect(await store.claim({ id, token: 'new', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await forget({ id, token: 'old' }), "an operator's forget with the token read before").toBe(false);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'new', fingerprint: 'fp' });
        await store.complete({ id, token: 'new', response: response(new Uint8Array([2])), retentionMs: 60_000 });
        expect(await forget({ id, token: 'old' })).toBe(false);
        expect((await store.get(id))?.state).toBe('completed');
      });

      it('forgets an abandoned record with its token, and refuses the old token once it was taken over', async ({
        skip,
      }) => {
        if (store.forget === undefined) return skip(noForget);
        if (!harness.endLease) return skip('the harness gives no endLease');
        const forgotten = freshId();
        await store.claim({ id: forgotten, token: 'a', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: keepMs });
        await harness.endLease(forgotten, 5_000);
        expect((await store.get(forgotten))?.state).toBe('abandoned');
        expect(await forget({ id: forgotten, token: 'a' })).toBe(true);
        expect(await store.get(forgotten)).toBeUndefined();
        const taken = freshId();
        await store.claim({ id: taken, token: 'a', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: keepMs });
        await harness.endLease(taken, 5_000);
        expect(
          await store.claim({
            id: taken,
            token: 'b',
            fingerprint: 'fp',
            leaseMs: 5_000,
            keepAfterLeaseMs: keepMs,
            replaces: 'a',
          }),
        ).toEqual({ claimed: true });
        expect(await forget({ id: taken, token: 'a' })).toBe(false);
        expect(await store.get(taken)).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp' });
      });
    });

    describe('abandoned records: a lease that ran out with nobody renewing it', () => {
      const noEndLease = 'the harness gives no endLease';
      const crashed = async (fingerprint = 'fp1') => {
        const id = freshId();
        expect(await store.claim({ id, token: 'a', fingerprint, leaseMs: 5_000, keepAfterLeaseMs: keepMs })).toEqual({
          claimed: true,
        });
        await harness.endLease?.(id, 5_000);
        return id;
      };

      it('keeps the record as abandoned and answers every claim that does not name its token with it', async ({
        skip,
      }) => {
        if (!harness.endLease) return skip(noEndLease);
        const id = await crashed();
        const abandoned = { state: 'abandoned', token: 'a', fingerprint: 'fp1' };
        expect(await store.get(id)).toEqual(abandoned);
        expect(
          await store.claim({ id, token: 'b', fingerprint: 'fp2', leaseMs: 5_000, keepAfterLeaseMs: keepMs }),
        ).toEqual({ claimed: false, record: abandoned });
        expect(
          await store.claim({
            id,
            token: 'c',
            fingerprint: 'fp1',
            leaseMs: 5_000,
            keepAfterLeaseMs: keepMs,
            replaces: 'z',
          }),
        ).toEqual({ claimed: false, record: abandoned });
        expect(await store.get(id)).toEqual(abandoned);
      });

      it('is taken over by the claim that names its token, once, and its old holder is fenced', async ({ skip }) => {
        if (!harness.endLease) return skip(noEndLease);
        const id = await crashed();
        const takeover = { id, fingerprint: 'fp1', leaseMs: 5_000, keepAfterLeaseMs: keepMs, replaces: 'a' };
        expect(await store.claim({ ...takeover, token: 'b' })).toEqual({ claimed: true });
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp1' });
        expect(await store.claim({ ...takeover, token: 'c' })).toEqual({
          claimed: false,
          record: { state: 'in_progress', token: 'b', fingerprint: 'fp1' },
        });
        expect(await store.renew({ id, token: 'a', leaseMs: 5_000 })).toBe(false);
        expect(
          await store.complete({ id, token: 'a', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
        ).toBe(false);
        expect(await store.release({ id, token: 'a' })).toBe(false);
        expect(
          await store.complete({ id, token: 'b', response: response(new Uint8Array([2])), retentionMs: 60_000 }),
        ).toBe(true);
        const record = await store.get(id);
        expect(record?.state === 'completed' && [...record.response.body]).toEqual([2]);
      });

      it('of many concurrent takeovers naming its token, exactly one wins', async ({ skip }) => {
        if (!harness.endLease) return skip(noEndLease);
        const id = await crashed();
        const results = await Promise.all(
          Array.from({ length: concurrency }, (_, i) =>
            store.claim({
              id,
              token: `t${i}`,
              fingerprint: 'fp1',
              leaseMs: 5_000,
              keepAfterLeaseMs: keepMs,
              replaces: 'a',
            }),
          ),
        );
        expect(results.filter((result) => result.claimed)).toHaveLength(1);
        for (const result of results) {
          if (!result.claimed) expect(result.record.state).toBe('in_progress');
        }
      });

      it('still belongs to its holder: a late completion stores the outcome, a renewal gives it a lease, a release frees it', async ({
        skip,
      }) => {
        if (!harness.endLease) return skip(noEndLease);
        const completed = await crashed();
        expect(
          await store.complete({
            id: completed,
            token: 'a',
            response: response(new Uint8Array([3])),
            retentionMs: 60_000,
          }),
        ).toBe(true);
        expect((await store.get(completed))?.state).toBe('completed');
        const renewed = await crashed();
        expect(await store.renew({ id: renewed, token: 'a', leaseMs: 5_000 })).toBe(true);
        expect(await store.get(renewed)).toEqual({ state: 'in_progress', token: 'a', fingerprint: 'fp1' });
        // The renewal carried the keep over: a second crash leaves it abandoned again, not gone.
        await harness.endLease(renewed, 5_000);
        expect((await store.get(renewed))?.state).toBe('abandoned');
        const released = await crashed();
        expect(await store.release({ id: released, token: 'a' })).toBe(true);
        expect(await store.get(released)).toBeUndefined();
      });

      it('refuses a takeover once its holder renewed or completed it, and answers with that record', async ({
        skip,
      }) => {
        if (!harness.endLease) return skip(noEndLease);
        // The engine saw the record abandoned, then names its token; meanwhile its holder came back.
        const takeover = { fingerprint: 'fp1', leaseMs: 5_000, keepAfterLeaseMs: keepMs, replaces: 'a', token: 'b' };
        const renewed = await crashed();
        expect(await store.renew({ id: renewed, token: 'a', leaseMs: 5_000 })).toBe(true);
        expect(
          await store.claim({ id: renewed, ...takeover }),
          'a takeover of a record its holder renewed (it is live again, not abandoned)',
        ).toEqual({ claimed: false, record: { state: 'in_progress', token: 'a', fingerprint: 'fp1' } });
        const completed = await crashed();
        expect(
          await store.complete({
            id: completed,
            token: 'a',
            response: response(new Uint8Array([4])),
            retentionMs: 60_000,
          }),
        ).toBe(true);
        const refused = await store.claim({ id: completed, ...takeover });
        expect(refused.claimed, 'a takeover of a record its holder completed (the outcome must stay)').toBe(false);
        expect(!refused.claimed && refused.record.state).toBe('completed');
      });

      it('of a late completion and a takeover raced, exactly one succeeds', async ({ skip }) => {
        if (!harness.endLease) return skip(noEndLease);
        // complete() is one compare-and-set on the token: a read, a check and a write in separate round
        // trips would let the late holder's completion and the takeover that fences it both succeed.
        for (let round = 0; round < 10; round++) {
          const id = await crashed();
          const [completed, takeover] = await Promise.all([
            store.complete({ id, token: 'a', response: response(new Uint8Array([5])), retentionMs: 60_000 }),
            store.claim({
              id,
              token: 'b',
              fingerprint: 'fp1',
              leaseMs: 5_000,
              keepAfterLeaseMs: keepMs,
              replaces: 'a',
            }),
          ]);
          expect(
            [completed, takeover.claimed].filter(Boolean),
            'of a late complete() and a takeover naming its token, exactly one may succeed',
          ).toHaveLength(1);
          const record = await store.get(id);
          expect(record?.state).toBe(completed ? 'completed' : 'in_progress');
        }
      });

      it('is not kept at all for a claim without keepAfterLeaseMs (the contract before it)', async ({ skip }) => {
        if (!harness.endLease) return skip(noEndLease);
        const id = freshId();
        await store.claim({ id, token: 'a', fingerprint: 'fp1', leaseMs: 5_000 });
        await harness.endLease(id, 5_000);
        expect(await store.get(id)).toBeUndefined();
        expect(await store.claim({ id, token: 'b', fingerprint: 'fp2', leaseMs: 5_000 })).toEqual({ claimed: true });
      });

      it('is forgotten with its keep, when it expires', async ({ skip }) => {
        if (!harness.endLease) return skip(noEndLease);
        const id = await crashed();
        await harness.expire(id);
        expect(await store.get(id)).toBeUndefined();
        expect(
          await store.claim({ id, token: 'b', fingerprint: 'fp2', leaseMs: 5_000, keepAfterLeaseMs: keepMs }),
        ).toEqual({ claimed: true });
      });
    });

    it('keeps hostile keys and different scopes apart', async () => {
      const keys = ['a:b', 'a', 'a/b', 'a%2Fb', 'line\nbreak', 'x'.repeat(255), 'x'.repeat(254), ' spaced ', '*', 'é'];
      // A nonce per run keeps records of earlier runs in a persistent store out of the way.
      const run = randomUUID();
      const ids = new Set<string>();
      for (const key of keys) {
        for (const scope of ['user:1', 'user:2', 'user:1:POST'])
          ids.add(recordId(`${scope}:${run}`, 'POST /charges', key));
      }
      // Raw ids with separators too: a store must not build colliding keys out of them either.
      const raw = [`raw:${run}:a`, `raw:${run}`, `raw/${run}`, `raw:${run}\n`];
      for (const id of raw) ids.add(id);
      expect(ids.size).toBe(keys.length * 3 + raw.length);
      const list = [...ids];
      for (const [i, id] of list.entries()) {
        expect(await store.claim({ id, token: `t${i}`, fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
      }
      for (const [i, id] of list.entries()) {
        expect((await store.get(id))?.token).toBe(`t${i}`);
      }
    });

    // A string with no UTF-8 form (a lone surrogate) is sent by node-postgres and ioredis as U+FFFD,
    // so "a\ud800" and "a\udc00" would be one record there (two callers meeting on one record), and
    // PostgreSQL `text` cannot hold U+0000 at all. The engine hands stores SHA-256 digests, but a
    // direct caller may hand any string: every store refuses these, the same way, before any I/O.
    it('refuses, with a TypeError and before it writes anything, an id, token or fingerprint holding U+0000 or a lone surrogate', async () => {
      const unkeepable = ['nul\u0000', '\u0000', 'high\ud800', 'low\udc00', 'reversed\udc00\ud800', '\ud800'];
      const done = response(new Uint8Array([1]));
      for (const bad of unkeepable) {
        const id = freshId();
        await refused(() => store.claim({ id: `${id}${bad}`, token: 't', fingerprint: 'fp', leaseMs: 5_000 }));
        await refused(() => store.claim({ id, token: `t${bad}`, fingerprint: 'fp', leaseMs: 5_000 }));
        await refused(() => store.claim({ id, token: 't', fingerprint: `fp${bad}`, leaseMs: 5_000 }));
        await refused(() => store.get(`${id}${bad}`));
        expect(await store.get(id)).toBeUndefined();
        expect(await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        await refused(() => store.claim({ id, token: 'u', fingerprint: 'fp', leaseMs: 5_000, replaces: `t${bad}` }));
        for (const [field, value] of [
          ['id', `${id}${bad}`],
          ['token', `t${bad}`],
        ] as const) {
          const input = { id, token: 't', [field]: value };
          await refused(() => store.renew({ ...input, leaseMs: 5_000 }));
          await refused(() => store.complete({ ...input, response: done, retentionMs: 60_000 }));
          await refused(() => store.release(input));
          if (store.forget !== undefined) await refused(() => store.forget?.(input));
        }
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: 'fp' });
        expect(await store.release({ id, token: 't' })).toBe(true);
      }
    });

    // An empty id would be one record for every caller that sends none, and an empty token a fence
    // any caller passes without holding a claim: refused by every store, as the strings above are. An
    // empty fingerprint is a fingerprint (a caller that compares none).
    it('refuses, with a TypeError and before it writes anything, an empty id, token or replaces; takes an empty fingerprint', async () => {
      const id = freshId();
      const done = response(new Uint8Array([1]));
      await refused(() => store.claim({ id: '', token: 't', fingerprint: 'fp', leaseMs: 5_000 }));
      await refused(() => store.claim({ id, token: '', fingerprint: 'fp', leaseMs: 5_000 }));
      await refused(() => store.get(''));
      expect(await store.get(id)).toBeUndefined();
      expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
      await refused(() => store.claim({ id, token: 'u', fingerprint: '', leaseMs: 5_000, replaces: '' }));
      for (const input of [
        { id: '', token: 't' },
        { id, token: '' },
      ]) {
        await refused(() => store.renew({ ...input, leaseMs: 5_000 }));
        await refused(() => store.complete({ ...input, response: done, retentionMs: 60_000 }));
        await refused(() => store.release(input));
        if (store.forget !== undefined) await refused(() => store.forget?.(input));
      }
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      expect(await store.release({ id, token: 't' })).toBe(true);
    });

    // The refusal is of those strings only: a store must keep apart, and give back exactly, every
    // other string, U+FFFD (what a lone surrogate would have become), astral characters (a surrogate
    // pair, well formed) and control characters other than U+0000 included.
    it('keeps ids, tokens and fingerprints apart that differ only in characters outside ASCII: U+FFFD, astral, control', async () => {
      const run = randomUUID();
      const odd = ['\ufffd', '\ud83d\ude00', '\ud800\udc00', '\u0001', '\u007f', '\u0085', '\u2028', '\uffff', 'é'];
      for (const [i, c] of odd.entries()) {
        const id = `${run}:${c}`;
        expect(await store.claim({ id, token: `t${c}`, fingerprint: `fp${c}`, leaseMs: 5_000 })).toEqual({
          claimed: true,
        });
        expect(await store.renew({ id, token: `t${c}`, leaseMs: 5_000 }), `renew ${i}`).toBe(true);
      }
      for (const c of odd) {
        expect(await store.get(`${run}:${c}`)).toEqual({ state: 'in_progress', token: `t${c}`, fingerprint: `fp${c}` });
      }
    });

    it('keeps a claim for its lease, a renewal for the new lease and an outcome for its retention, by the store clock', async ({
      skip,
    }) => {
      const { ttl, advance } = harness;
      if (ttl === undefined && advance === undefined) return skip('the harness gives neither ttl nor advance');
      const id = freshId();
      expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs })).toEqual({ claimed: true });
      if (ttl !== undefined) {
        const lease = (await ttl(id)) ?? 0;
        expect(lease).toBeGreaterThan(leaseMs - slackMs);
        expect(lease).toBeLessThanOrEqual(leaseMs + tickMs);
        expect(await store.renew({ id, token: 't', leaseMs: renewedLeaseMs })).toBe(true);
        const renewed = (await ttl(id)) ?? 0;
        expect(renewed).toBeGreaterThan(renewedLeaseMs - slackMs);
        expect(renewed).toBeLessThanOrEqual(renewedLeaseMs + tickMs);
        const stored = response(new Uint8Array([1]));
        expect(await store.complete({ id, token: 't', response: stored, retentionMs })).toBe(true);
        const retention = (await ttl(id)) ?? 0;
        expect(retention).toBeGreaterThan(retentionMs - slackMs);
        expect(retention).toBeLessThanOrEqual(retentionMs + tickMs);
        return;
      }
      if (advance === undefined) return;
      // Just before the end the record is there; just after, it is gone. No wall clock involved.
      const held = async () => (await store.get(id)) !== undefined;
      await advance(leaseMs - 1);
      expect(await held()).toBe(true);
      expect(await store.renew({ id, token: 't', leaseMs: renewedLeaseMs })).toBe(true);
      await advance(renewedLeaseMs - 1);
      expect(await held()).toBe(true);
      expect(await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs })).toBe(true);
      await advance(retentionMs - 1);
      expect((await store.get(id))?.state).toBe('completed');
      await advance(2);
      expect(await held()).toBe(false);

      const lapsed = freshId();
      await store.claim({ id: lapsed, token: 't', fingerprint: '', leaseMs });
      await advance(leaseMs + 1);
      expect(await store.get(lapsed)).toBeUndefined();
      expect(await store.renew({ id: lapsed, token: 't', leaseMs })).toBe(false);
    });

    it('keeps a record keepAfterLeaseMs past its lease, through renewals, by the store clock', async ({ skip }) => {
      const { ttl, advance } = harness;
      if (ttl === undefined && advance === undefined) return skip('the harness gives neither ttl nor advance');
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
      if (ttl !== undefined) {
        const left = (await ttl(id)) ?? 0;
        expect(left).toBeGreaterThan(leaseMs + keepMs - slackMs);
        expect(left).toBeLessThanOrEqual(leaseMs + keepMs + tickMs);
        expect(await store.renew({ id, token: 't', leaseMs: renewedLeaseMs })).toBe(true);
        const renewed = (await ttl(id)) ?? 0;
        expect(renewed).toBeGreaterThan(renewedLeaseMs + keepMs - slackMs);
        expect(renewed).toBeLessThanOrEqual(renewedLeaseMs + keepMs + tickMs);
        return;
      }
      if (advance === undefined) return;
      await advance(leaseMs - 1);
      expect((await store.get(id))?.state).toBe('in_progress');
      await advance(1);
      expect((await store.get(id))?.state).toBe('abandoned');
      expect(await store.renew({ id, token: 't', leaseMs: renewedLeaseMs })).toBe(true);
      await advance(renewedLeaseMs - 1);
      expect((await store.get(id))?.state).toBe('in_progress');
      await advance(keepMs);
      expect((await store.get(id))?.state).toBe('abandoned');
      await advance(1);
      expect(await store.get(id)).toBeUndefined();
    });

    it('keeps an outcome for its retention, also when its claim kept a record longer', async ({ skip }) => {
      // The engine claims with a keep as long as its retention, and an outcome policy may keep an
      // outcome for less (a 5xx for a minute): a store that never shortens a record (the later of
      // the two ends) would replay it for the whole keep.
      const { ttl, advance } = harness;
      if (ttl === undefined && advance === undefined) return skip('the harness gives neither ttl nor advance');
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs, keepAfterLeaseMs: keepMs });
      expect(await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs })).toBe(true);
      if (ttl !== undefined) {
        const left = (await ttl(id)) ?? 0;
        expect(left).toBeGreaterThan(retentionMs - slackMs);
        expect(left).toBeLessThanOrEqual(retentionMs + tickMs);
        return;
      }
      if (advance === undefined) return;
      await advance(retentionMs - 1);
      expect((await store.get(id))?.state).toBe('completed');
      await advance(2);
      expect(await store.get(id)).toBeUndefined();
    });

    it("times leases and retention by the store's clock, not the application's", async ({ skip }) => {
      // An application server whose clock is an hour off must neither stretch nor cut a lease: a
      // store that sends `Date.now() + leaseMs` as the end would. Only a harness that reads the time
      // left from the store (`ttl`) can tell; with `advance` the harness's clock is the store's.
      const { ttl } = harness;
      if (ttl === undefined) return skip('the harness gives no ttl');
      const id = freshId();
      const stored = response(new Uint8Array([1]));
      // Only `Date` is faked (timers run as before), set an hour ahead, for the writes and the reads.
      const ahead = async <T>(run: () => T | PromiseLike<T>): Promise<T> => {
        vi.useFakeTimers({ toFake: ['Date'], now: Date.now() + 3_600_000 });
        try {
          return await run();
        } finally {
          vi.useRealTimers();
        }
      };
      // Read while the application's clock is still off too: an embedded store (PGlite) runs on
      // that very clock, which is then the store's own.
      const within = async (ms: number) => {
        const left = (await ahead(() => ttl(id))) ?? 0;
        expect(left).toBeGreaterThan(ms - slackMs);
        expect(left).toBeLessThanOrEqual(ms + tickMs);
      };
      expect(await ahead(() => store.claim({ id, token: 't', fingerprint: '', leaseMs }))).toEqual({ claimed: true });
      await within(leaseMs);
      expect(await ahead(() => store.renew({ id, token: 't', leaseMs: renewedLeaseMs }))).toBe(true);
      await within(renewedLeaseMs);
      expect(await ahead(() => store.complete({ id, token: 't', response: stored, retentionMs }))).toBe(true);
      await within(retentionMs);
    });

    it('renews a lease to the duration given from now, a shorter one than is left too', async ({ skip }) => {
      // A renewal sets the lease, it does not only stretch it: a store that kept the longer of the
      // two would hold a crashed executor's key longer than the lease the caller now asks for.
      const { ttl, advance } = harness;
      if (ttl === undefined && advance === undefined) return skip('the harness gives neither ttl nor advance');
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: renewedLeaseMs });
      expect(await store.renew({ id, token: 't', leaseMs })).toBe(true);
      if (ttl !== undefined) {
        const lease = (await ttl(id)) ?? 0;
        expect(lease).toBeGreaterThan(leaseMs - slackMs);
        expect(lease).toBeLessThanOrEqual(leaseMs + tickMs);
        return;
      }
      if (advance === undefined) return;
      await advance(leaseMs - 1);
      expect(await store.get(id)).toBeDefined();
      await advance(2);
      expect(await store.get(id)).toBeUndefined();
    });

    describe('size cap (harness.makeCapped)', () => {
      const cap = 1_000;
      // A response of `bytes` as storedResponseSize measures it: the helper's headers and framing, then body.
      const sized = (bytes: number) => {
        const empty = response(new Uint8Array(0), 200);
        return response(new Uint8Array(bytes - storedResponseSize(empty)).fill(7), 200);
      };
      let capped: Store | undefined;
      beforeAll(async () => {
        capped = await harness.makeCapped?.(cap);
      });

      it('refuses a response over the cap with ResponseTooLargeError and leaves the claim untouched', async ({
        skip,
      }) => {
        if (capped === undefined) return skip('the store has no size cap');
        const small = capped;
        const id = freshId();
        await small.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
        // A store may throw at once (one that answers synchronously) or reject.
        const error = await (async () =>
          small.complete({ id, token: 't', response: sized(cap + 1), retentionMs: 60_000 }))()
          .then(() => undefined)
          .catch((caught: unknown) => caught);
        expect(isResponseTooLargeError(error)).toBe(true);
        expect(error).toMatchObject({ code: 'response_too_large', bytes: cap + 1, limit: cap });
        expect(await small.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: 'fp' });
      });

      it('declares no cap, or the one it refuses above (the adapters read it to settle a response in advance)', async ({
        skip,
      }) => {
        if (capped === undefined) return skip('the store has no size cap');
        expect([undefined, cap]).toContain(capped.maxResponseBytes);
      });

      it('stores a response of exactly the cap', async ({ skip }) => {
        if (capped === undefined) return skip('the store has no size cap');
        const id = freshId();
        await capped.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const exact = sized(cap);
        expect(await capped.complete({ id, token: 't', response: exact, retentionMs: 60_000 })).toBe(true);
        const record = await capped.get(id);
        expect(record?.state === 'completed' && record.response.body.length).toBe(exact.body.length);
      });

      it('through the engine: not stored, a store-error event, and the key free for a retry', async ({ skip }) => {
        if (capped === undefined) return skip('the store has no size cap');
        const small = capped;
        const events: IdempotencyEvent[] = [];
        const engine = createIdempotency({ store: small, heartbeat: false, onEvent: (event) => events.push(event) });
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /exports' };
        const first = await engine.begin(request);
        expect(first.kind).toBe('execute');
        if (first.kind !== 'execute') return;
        const result = await engine.complete(first.lease, sized(5 * cap));
        expect(result).toMatchObject({ ok: false, reason: 'store-error' });
        expect(!result.ok && isResponseTooLargeError(result.error)).toBe(true);
        expect(
          events.some((e) => e.type === 'store-error' && e.phase === 'complete' && isResponseTooLargeError(e.error)),
        ).toBe(true);
        // The engine's release runs in the background: wait for it, not for a timer.
        await expect.poll(() => small.get(first.lease.id)).toBeUndefined();
        expect((await engine.begin(request)).kind).toBe('execute');
      });
    });

    it(`runs exactly one of ${concurrency} concurrent engine requests with one key`, async () => {
      const engine = createIdempotency({ store, heartbeat: false });
      let executions = 0;
      const key = randomUUID();
      const outcomes = await Promise.all(
        Array.from({ length: concurrency }, async () => {
          const started = await engine.begin({ key, scope: 'user:1', operation: 'POST /charges', fingerprint: 'fp' });
          if (started.kind !== 'execute') return started.kind === 'reject' ? started.error.code : started.kind;
          executions++;
          await engine.complete(started.lease, response(new Uint8Array([42])));
          return 'execute';
        }),
      );
      expect(executions).toBe(1);
      expect(outcomes.filter((o) => o === 'execute')).toHaveLength(1);
      for (const outcome of outcomes) expect(['execute', 'in_progress', 'replay']).toContain(outcome);
    });
  });
}
