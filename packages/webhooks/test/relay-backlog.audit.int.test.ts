// Audit (branch audit-relaybacklog): the relay's claim behind a backlog it may not take (a URL at
// its share, or at its one slot as an unanswered endpoint), at the head of the due rows. A claim
// reads at most a bounded head of the `_due` index; when that head was all rows it could not take,
// it walks the other URLs through `_url`, a bounded number per claim, from where its last walk
// stopped. Against real PostgreSQL, PgBouncer in transaction mode, PGlite and real HTTP endpoints.
// Tables are named `audit_relaybacklog_*`.
import { randomBytes } from 'node:crypto';
import { PGlite } from '@electric-sql/pglite';
import { describe, expect, it } from 'vitest';
import { pgBouncerAvailable, startPgBouncer } from '../../testkit/test/audit-support/pgbouncer.js';
import { createOutbox, createSender, type Queryable } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool } from './support/postgres.js';
import { endpoint, hanging, relayTable, until, watched } from './support/relay-kit.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('relay backlog audit');

// The relay's two claim statements, told apart by their text: the head of `_due`, and the walk
// through `_url` that follows it only when that head was all rows the claim could not take.
const isClaim = (text: string) => text.includes('candidate AS (');
const isWalk = (text: string) => text.includes('WITH RECURSIVE') && text.includes('walk (');

/** Rows of `urls`, `perUrl` each, due `dueAgoMs` ago (later URLs and later rows a microsecond later). */
async function addMany(db: Queryable, table: string, urls: string[], perUrl: number, prefix: string, dueAgoMs = 0) {
  await db.query(
    `INSERT INTO "${table}" (id, url, body, next_attempt_at)
     SELECT $2 || u || '_' || n, ($1::text[])[u], convert_to('{}', 'UTF8'),
            now() - ($4::double precision * interval '1 millisecond') + (u * $3 + n) * interval '1 microsecond'
       FROM generate_series(1, array_length($1::text[], 1)) AS u, generate_series(1, $3::int) AS n`,
    [urls, prefix, perUrl, dueAgoMs],
  );
  return urls.length * perUrl;
}

/**
 * runOnce() on `db` behind a backlog of one URL longer than the head a claim reads (1,000 rows for
 * a batch of 4), with maxPerUrl 1: the round's first claim takes that URL's one row, the next one
 * leaves it out, finds the head all its rows, and reaches the other URLs by the walk. The round
 * after it goes on where the walk stopped.
 */
async function behindTheBacklog(db: Queryable, table: string) {
  const server = await endpoint();
  try {
    const outbox = createOutbox({ table });
    await outbox.migrate(db);
    await addMany(db, table, [`${server.base}/full`], 1_500, 'evt_full_', 3_600_000);
    const others = Array.from({ length: 6 }, (_, n) => `${server.base}/o${n}`);
    await addMany(db, table, others, 1, 'evt_other_', 1_000);
    const relay = outbox.relay({
      db,
      sender: createSender({ secret: SECRET }),
      batchSize: 4,
      maxPerUrl: 1,
      pollInterval: '20ms',
    });
    const rounds = [];
    for (let n = 0; n < 3; n++) {
      const before = new Set(server.arrivals.keys());
      const round = await relay.runOnce();
      rounds.push({ round, sent: [...server.arrivals.keys()].filter((id) => !before.has(id)).sort() });
    }
    // Each round: one row of the backlog's URL (its share), the rest from the others, none twice.
    expect(rounds[0]).toEqual({
      round: { claimed: 4, delivered: 4, retrying: 0, dead: 0, fenced: 0 },
      sent: ['evt_full_1_1', 'evt_other_1_1', 'evt_other_2_1', 'evt_other_3_1'],
    });
    expect(rounds[1]).toEqual({
      round: { claimed: 4, delivered: 4, retrying: 0, dead: 0, fenced: 0 },
      sent: ['evt_full_1_2', 'evt_other_4_1', 'evt_other_5_1', 'evt_other_6_1'],
    });
    // Nothing left but the backlog: the walk goes round once, finds no row, and the round ends.
    expect(rounds[2]).toEqual({
      round: { claimed: 1, delivered: 1, retrying: 0, dead: 0, fenced: 0 },
      sent: ['evt_full_1_3'],
    });
    expect([...server.arrivals.values()].every((count) => count === 1)).toBe(true);
  } finally {
    await server.close();
  }
}

describe.skipIf(!available)('outbox relay claims behind a backlog, on real PostgreSQL', () => {
  const pool = testPool({ max: 20 });
  const { table, outbox, closers, clear, started } = relayTable(pool, 'audit_relaybacklog');

  // The walk must not starve anyone: it looks at a bounded number of URLs per claim (32 for a
  // batch of 10), and 100 healthy URLs wait behind a dead endpoint's 3,000 due rows (three times
  // the head a claim reads), after (in the order of `_url`) 100 URLs whose only row waits for a
  // retry an hour away. A walk that started from the first URL every time would look at the same
  // 32 waiting URLs, claim after claim, and never reach a healthy one; a claim that gave up past
  // the head would reach none either. Every healthy event arrives, once, the waiting ones stay
  // waiting, and no URL ever had more than its share open.
  it('delivers every healthy URL behind a dead endpoint and URLs waiting for a retry, more than a walk looks at', async () => {
    await clear();
    const dead = await endpoint(hanging);
    const server = await endpoint();
    closers.push(dead.close, server.close);
    await addMany(pool, table, [`${dead.base}/dead`], 3_000, 'evt_dead_', 3_600_000);
    const waiting = Array.from({ length: 100 }, (_, n) => `${server.base}/a-wait${String(n).padStart(3, '0')}`);
    await addMany(pool, table, waiting, 1, 'evt_wait_', -3_600_000);
    const healthy = Array.from({ length: 100 }, (_, n) => `${server.base}/b-ok${String(n).padStart(3, '0')}`);
    const total = await addMany(pool, table, healthy, 3, 'evt_ok_', 60_000);
    await pool.query(`ANALYZE "${table}"`);
    const watch = watched(pool);
    const relay = started(
      outbox.relay({
        db: watch.db,
        sender: createSender({ secret: SECRET, timeout: '2s' }),
        pollInterval: '20ms',
      }),
    );
    await until(() => server.arrivals.size === total, 'every healthy event');
    await relay.stop();
    expect([...server.arrivals.keys()].every((id) => id.startsWith('evt_ok_'))).toBe(true);
    expect([...server.arrivals.values()].every((count) => count === 1)).toBe(true);
    expect(Math.max(...server.mostOpen.values())).toBeLessThanOrEqual(5);
    expect(dead.mostOpen.get('/dead')).toBeLessThanOrEqual(5);
    // The healthy rows were past the head: the walk is what reached them.
    expect(watch.queries.filter((query) => isWalk(query.text)).length).toBeGreaterThan(0);
  });

  // The common case keeps its price: 2,000 URLs with due rows, none at its share. Every claim of
  // the loop (runOnce, then start() until all 4,000 events are delivered) is the one statement it
  // was, never followed by the walk, and reads no more of `_due` than its candidates: the plan
  // shows the index scan stop at them, no row read past, and no `_url` at all.
  it('many URLs, none at its share: one statement a claim, no walk, the head read no further than before', async () => {
    await clear();
    const server = await endpoint();
    closers.push(server.close);
    const urls = Array.from({ length: 2_000 }, (_, n) => `${server.base}/u${n}`);
    const total = await addMany(pool, table, urls, 2, 'evt_many_', 60_000);
    await pool.query(`ANALYZE "${table}"`);
    const watch = watched(pool);
    const relay = outbox.relay({
      db: watch.db,
      sender: createSender({ secret: SECRET }),
      batchSize: 10,
      pollInterval: '20ms',
    });
    const first = watch.queries.length;
    await relay.runOnce();
    const claim = watch.queries.slice(first).find((query) => isClaim(query.text));
    expect(claim).toBeDefined();
    const client = await pool.connect();
    let plan = '';
    try {
      await client.query('BEGIN');
      const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS) ${claim?.text}`, claim?.values);
      plan = rows.map((row) => row['QUERY PLAN']).join('\n');
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
    console.info(`claim among 2,000 URLs: ${/Execution Time: .*/.exec(plan)?.[0]}`);
    // The candidates: twice the limit (20), read in due order and no further.
    const headScan = /Index Scan using \S+_due on .*\(actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=1\)/.exec(plan);
    expect(Number(headScan?.[1])).toBe(20);
    expect(plan).not.toMatch(/Rows Removed by Filter: [1-9]/);
    expect(plan).not.toMatch(/_url on/);
    started(relay);
    await until(() => server.arrivals.size === total, 'every event', 60_000);
    await relay.stop();
    expect(watch.queries.filter((query) => isWalk(query.text))).toHaveLength(0);
  }, 90_000);

  // Held: the two statements of a claim (the head, then the walk) work on real PostgreSQL through
  // runOnce, and the walk goes on where the last one stopped.
  it('runOnce behind a backlog longer than the head: one row of it a round, the others by the walk', async () => {
    await clear();
    await behindTheBacklog(pool, table);
  });

  // Held: the rows the walk finds are claimed by the same lock and checks as the head's: a row
  // whose relay died mid-attempt is taken over unread (its lost attempt in its history, put back
  // without an attempt), one at maxAttempts is dead-lettered by the claim, unread, and a fresh one
  // is sent. All three behind a backlog longer than the head.
  it('the walk takes over a crashed row and dead-letters a spent one, as the head does', async () => {
    await clear();
    const server = await endpoint();
    closers.push(server.close);
    await addMany(pool, table, [`${server.base}/full`], 1_500, 'evt_full_', 3_600_000);
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, claims, locked_by, locked_until, next_attempt_at) VALUES
         ('evt_crashed', $1, convert_to('{}', 'UTF8'), 1, 1, 'a-relay-that-died', now() - interval '1 minute', now() - interval '2 minutes'),
         ('evt_spent', $2, convert_to('{}', 'UTF8'), 3, 3, NULL, NULL, now() - interval '1 second'),
         ('evt_fresh', $3, convert_to('{}', 'UTF8'), 0, 0, NULL, NULL, now() - interval '1 second')`,
      [`${server.base}/c`, `${server.base}/s`, `${server.base}/f`],
    );
    const watch = watched(pool);
    const relay = outbox.relay({
      db: watch.db,
      sender: createSender({ secret: SECRET, schedule: { maxAttempts: 3 } }),
      batchSize: 4,
      maxPerUrl: 1,
    });
    expect(await relay.runOnce()).toEqual({ claimed: 4, delivered: 2, retrying: 1, dead: 1, fenced: 0 });
    expect(watch.queries.filter((query) => isWalk(query.text))).toHaveLength(1);
    expect([...server.arrivals.keys()].sort()).toEqual(['evt_fresh', 'evt_full_1_1']);
    const { rows } = await pool.query(
      `SELECT id, status, dead_reason, attempts, locked_by, history FROM "${table}" WHERE id IN ('evt_crashed', 'evt_spent')
        ORDER BY id`,
    );
    expect(rows[0]).toMatchObject({ id: 'evt_crashed', status: 'pending', attempts: 1, locked_by: null });
    expect(rows[0].history).toEqual([
      expect.objectContaining({ attempt: 1, result: 'lost', claim: 1, relayId: 'a-relay-that-died' }),
    ]);
    expect(rows[1]).toMatchObject({ id: 'evt_spent', status: 'dead', dead_reason: 'max-attempts', attempts: 3 });
  });
});

// Held: behind PgBouncer in transaction mode the walk is one more ordinary statement (its cursor is
// kept by the relay, not by the session): the rounds are the same.
describe.runIf(available && pgBouncerAvailable('the relay backlog PgBouncer audit'))(
  'outbox relay claims behind a backlog, through PgBouncer in transaction mode',
  () => {
    it('runOnce behind a backlog longer than the head: one row of it a round, the others by the walk', async () => {
      const admin = testPool({ max: 2 });
      const bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 2 });
      const bounced = testPool({ connectionString: bouncer.url, max: 4 });
      const table = `audit_relaybacklog_pgb_${randomBytes(4).toString('hex')}`;
      try {
        await behindTheBacklog(bounced, table);
      } finally {
        await admin.query(`DROP TABLE IF EXISTS "${table}"`);
        await bounced.end();
        await admin.end();
        await bouncer.stop();
      }
    });
  },
);

// Held: on PGlite the recursive walk and its LATERAL subqueries run as on PostgreSQL.
describe('outbox relay claims behind a backlog, on PGlite', () => {
  it('runOnce behind a backlog longer than the head: one row of it a round, the others by the walk', async () => {
    const lite = new PGlite();
    // PGlite's query() takes one statement, so the migration's script goes through exec().
    const db: Queryable = {
      query: async (text, values) => {
        if (values === undefined || values.length === 0) {
          const results = await lite.exec(text);
          const last = results.at(-1);
          return { rows: last?.rows ?? [], rowCount: last?.affectedRows ?? null };
        }
        const result = await lite.query(text, values);
        return { rows: result.rows as unknown[], rowCount: result.affectedRows ?? null };
      },
    };
    try {
      await behindTheBacklog(db, 'audit_relaybacklog_pglite');
    } finally {
      await lite.close();
    }
  }, 60_000);
});
