// A rolling deploy of the version that keeps reason phrases (`status_message`), in both directions,
// on PGlite and on the real PostgreSQL: the earlier version's store (a copy of it, see
// store-before-phrase/) keeps working on a table migrate() has given the column, while instances of
// both versions share it; and records pass between them, each replaying what it can.

import { randomUUID } from 'node:crypto';
import { PGlite } from '@electric-sql/pglite';
import { recordId, type StoredResponse, type StoreRecord } from '@idem/core';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, type PostgresClient, type PostgresStore, postgresStore } from '../src/index.js';
import { postgresAvailable, sql, testPool, uniqueTable } from './database.js';
import { postgresStore as earlierStore } from './store-before-phrase/postgres-store.js';

const freshId = () => recordId(`scope-${randomUUID()}`, 'POST /charges', randomUUID());
const answer = (text: string, status = 201, statusMessage?: string): StoredResponse => ({
  status,
  headers: { 'content-type': 'text/plain' },
  body: new TextEncoder().encode(text),
  ...(statusMessage === undefined ? {} : { statusMessage }),
});
const lineOf = (record: StoreRecord | undefined) =>
  record?.state === 'completed'
    ? [record.response.status, record.response.statusMessage, new TextDecoder().decode(record.response.body)]
    : record?.state;

const available = await postgresAvailable();

const backends: [string, boolean, () => Promise<{ client: PostgresClient; close(): Promise<void> }>][] = [
  [
    'PGlite',
    true,
    async () => {
      const db = new PGlite();
      return { client: db, close: () => db.close() };
    },
  ],
  [
    'a pg Pool',
    available,
    async () => {
      const pool: pg.Pool = testPool({ max: 4 });
      return { client: pool, close: () => pool.end() };
    },
  ],
];

for (const [label, runs, open] of backends) {
  describe.runIf(runs)(`status_message during a rolling deploy, on ${label}`, () => {
    let client: PostgresClient;
    let close: () => Promise<void>;
    let table: string;
    let earlier: ReturnType<typeof earlierStore>;
    let later: PostgresStore;
    beforeAll(async () => {
      ({ client, close } = await open());
      table = uniqueTable('phrase_deploy');
      await migrate(client, { table });
      earlier = earlierStore({ client, table });
      later = postgresStore({ client, table });
    });
    afterAll(async () => {
      await sql(client, `DROP TABLE IF EXISTS "${table}"`);
      await close();
    });

    it('the earlier version serves every operation from a migrated table', async () => {
      const id = freshId();
      expect(await earlier.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await earlier.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
      expect(await earlier.complete({ id, token: 't', response: answer('a'), retentionMs: 60_000 })).toBe(true);
      expect(lineOf(await earlier.get(id))).toEqual([201, undefined, 'a']);
      const replay = await earlier.claim({ id, token: 'u', fingerprint: 'fp', leaseMs: 5_000 });
      expect(replay.claimed === false && lineOf(replay.record)).toEqual([201, undefined, 'a']);

      const inTransaction = freshId();
      await earlier.claim({ id: inTransaction, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      expect(
        await earlier.transaction({ id: inTransaction, token: 't' }, async () => ({
          value: 'ran',
          response: answer('b'),
          retentionMs: 60_000,
        })),
      ).toEqual({ committed: true, value: 'ran' });
      const released = freshId();
      await earlier.claim({ id: released, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      expect(await earlier.release({ id: released, token: 't' })).toBe(true);
      expect(await earlier.forget({ id, token: 't' })).toBe(true);
      expect(await earlier.purgeExpired()).toBe(0);
    });

    it("records pass between the versions: the later replays the earlier's with the default phrase, the earlier the later's without its phrase", async () => {
      const fromEarlier = freshId();
      await earlier.claim({ id: fromEarlier, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await earlier.complete({ id: fromEarlier, token: 't', response: answer('a'), retentionMs: 60_000 });
      expect(lineOf(await later.get(fromEarlier))).toEqual([201, undefined, 'a']);

      const fromLater = freshId();
      await later.claim({ id: fromLater, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await later.complete({
        id: fromLater,
        token: 't',
        response: answer('b', 201, 'Created Fine'),
        retentionMs: 60_000,
      });
      expect(lineOf(await earlier.get(fromLater))).toEqual([201, undefined, 'b']);
      expect(lineOf(await later.get(fromLater))).toEqual([201, 'Created Fine', 'b']);

      // A claim of the earlier version completed by the later one, and the other way round.
      const claimedEarly = freshId();
      await earlier.claim({ id: claimedEarly, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await later.complete({
        id: claimedEarly,
        token: 't',
        response: answer('c', 202, 'Queued'),
        retentionMs: 60_000,
      });
      expect(lineOf(await later.get(claimedEarly))).toEqual([202, 'Queued', 'c']);
      const claimedLate = freshId();
      await later.claim({ id: claimedLate, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await earlier.complete({ id: claimedLate, token: 't', response: answer('d'), retentionMs: 60_000 });
      expect(lineOf(await later.get(claimedLate))).toEqual([201, undefined, 'd']);
    });

    // A limit of running both versions, accepted and documented (docs/stores.md, "A rolling deploy
    // may meet the table either way round"): the earlier version's claim takes an expired record over
    // by an UPDATE that clears status, headers and body but knows nothing of status_message, and its
    // completion does not write it. So a record the later version completed with a phrase, expired and
    // run again by an earlier instance before purgeExpired() deleted the row, keeps the old phrase.
    // Only the reason phrase, which clients ignore (RFC 9110 section 15.1); tying it to the token that
    // wrote it would cost a column for a deploy window. Pinned, so a change to it updates the page.
    it("a record the earlier version ran again after the later one's phrase keeps that phrase until purged (documented limit)", async () => {
      const id = freshId();
      await later.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await later.complete({ id, token: 't', response: answer('first', 201, 'Created Fine'), retentionMs: 60_000 });
      await sql(
        client,
        `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE id = $1`,
        [id],
      );
      expect(await earlier.claim({ id, token: 'u', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      await earlier.complete({ id, token: 'u', response: answer('second', 200), retentionMs: 60_000 });
      expect(lineOf(await later.get(id))).toEqual([200, 'Created Fine', 'second']);
    });
  });
}
