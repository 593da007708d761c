// A rolling deploy of the version that keeps reason phrases (`status_message`), in both directions,
// on PGlite and on the real PostgreSQL: the earlier version's statements (captured, see
// earlier-instance.ts) keep working on a table migrate() has given the column, while instances of
// both versions share it; and records pass between them, each replaying what it can. The table is
// the earlier version's default, `idem_records`, in a schema of this file's own (search_path), so
// the earlier statements run under the very names it prepared them by.

import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { PGlite } from '@electric-sql/pglite';
import { recordId, type StoredResponse, type StoreRecord } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, type PostgresClient, type PostgresStore, postgresStore } from '../src/index.js';
import { buildStatements } from '../src/statements.js';
import { parseTableName } from '../src/table-name.js';
import { postgresAvailable, sql, testPool } from './database.js';
import { type EarlierRow, earlierInstance, statementsBeforePhrase } from './earlier-instance.js';

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
// The same line from a row the earlier version read: its status, the phrase it read (none: it
// never names the column), its body.
const earlierLineOf = (row: EarlierRow | undefined) =>
  row?.state === 'completed'
    ? [row.status, row.status_message, new TextDecoder().decode(row.body as Uint8Array)]
    : row?.state;

// The claim that this version's statements, without the column, are the earlier version's exactly
// (statements.ts): same text, same prepared name. What lets an instance of this version on a table
// not yet migrated share a pooler's server sessions with earlier instances.
describe('the statements without status_message', () => {
  it("are the earlier version's, as it sent them: text and name", () => {
    const table = parseTableName('idem_records');
    const tag = createHash('sha256').update(table.name).digest('hex').slice(0, 12);
    expect(buildStatements(table, tag, { statusMessage: false })).toEqual(statementsBeforePhrase);
  });
});

const available = await postgresAvailable();
const schema = `idem_test_phrase_deploy_${randomBytes(4).toString('hex')}`;

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
      const setup = testPool({ max: 1 });
      await setup.query(`CREATE SCHEMA "${schema}"`);
      await setup.end();
      const pool = testPool({ max: 4, options: `-c search_path=${schema}` });
      return {
        client: pool,
        close: async () => {
          await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
          await pool.end();
        },
      };
    },
  ],
];

for (const [label, runs, open] of backends) {
  describe.runIf(runs)(`status_message during a rolling deploy, on ${label}`, () => {
    let client: PostgresClient;
    let close: () => Promise<void>;
    const table = 'idem_records';
    let earlier: ReturnType<typeof earlierInstance>;
    let later: PostgresStore;
    beforeAll(async () => {
      ({ client, close } = await open());
      await migrate(client, { table });
      earlier = earlierInstance(client);
      later = postgresStore({ client, table });
    });
    afterAll(async () => {
      await sql(client, `DROP TABLE IF EXISTS "${table}"`);
      await close();
    });

    it('the earlier version serves every operation from a migrated table', async () => {
      const id = freshId();
      expect(await earlier.claim(id, 't')).toEqual([expect.objectContaining({ claimed: true })]);
      expect(await earlier.renew(id, 't')).toBe(1);
      expect(await earlier.complete(id, 't', 'a')).toBe(1);
      expect(earlierLineOf(await earlier.get(id))).toEqual([201, undefined, 'a']);
      const replay = await earlier.claim(id, 'u');
      expect(replay.map((row) => [row.claimed, ...(earlierLineOf(row) as unknown[])])).toEqual([
        [false, 201, undefined, 'a'],
      ]);

      const inTransaction = freshId();
      await earlier.claim(inTransaction, 't');
      expect(await earlier.completeInTransaction(inTransaction, 't', 'b')).toBe(1);
      expect(lineOf(await later.get(inTransaction))).toEqual([201, undefined, 'b']);
      const released = freshId();
      await earlier.claim(released, 't');
      expect(await earlier.release(released, 't')).toBe(1);
      expect(await earlier.forget(id, 't')).toBe(1);
      expect(await earlier.purge()).toBe(0);
    });

    it("records pass between the versions: the later replays the earlier's with the default phrase, the earlier the later's without its phrase", async () => {
      const fromEarlier = freshId();
      await earlier.claim(fromEarlier, 't');
      await earlier.complete(fromEarlier, 't', 'a');
      expect(lineOf(await later.get(fromEarlier))).toEqual([201, undefined, 'a']);

      const fromLater = freshId();
      await later.claim({ id: fromLater, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await later.complete({
        id: fromLater,
        token: 't',
        response: answer('b', 201, 'Created Fine'),
        retentionMs: 60_000,
      });
      expect(earlierLineOf(await earlier.get(fromLater))).toEqual([201, undefined, 'b']);
      expect(lineOf(await later.get(fromLater))).toEqual([201, 'Created Fine', 'b']);

      // A claim of the earlier version completed by the later one, and the other way round.
      const claimedEarly = freshId();
      await earlier.claim(claimedEarly, 't');
      await later.complete({
        id: claimedEarly,
        token: 't',
        response: answer('c', 202, 'Queued'),
        retentionMs: 60_000,
      });
      expect(lineOf(await later.get(claimedEarly))).toEqual([202, 'Queued', 'c']);
      const claimedLate = freshId();
      await later.claim({ id: claimedLate, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await earlier.complete(claimedLate, 't', 'd');
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
      expect(await earlier.claim(id, 'u')).toEqual([expect.objectContaining({ claimed: true })]);
      await earlier.complete(id, 'u', 'second', 200);
      expect(lineOf(await later.get(id))).toEqual([200, 'Created Fine', 'second']);
    });
  });
}
