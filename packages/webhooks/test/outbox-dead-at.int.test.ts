// The outbox records when a row died (`dead_at`), on every path that dead-letters one, and
// purge({ dead: true }) counts a dead row's age from then: a row that retried for a year and died
// yesterday is kept `olderThan` from yesterday, not deleted at once for its year-old created_at.
// Real PostgreSQL; ages are written in SQL on the database's clock, never waited out.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, type Queryable } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox dead_at');

describe.skipIf(!available)('dead_at: when an outbox row died', () => {
  const pool = testPool({ max: 8 });
  const tables: string[] = [];
  // /gone answers 410, /busy 429, anything else 500.
  const server = createServer((request, response) => {
    request.resume();
    const status = request.url === '/gone' ? 410 : request.url === '/busy' ? 429 : 500;
    response.writeHead(status).end();
  });
  let base = '';
  const fresh = async (label: string) => {
    const table = uniqueTable(`dead_at_${label}`);
    tables.push(table);
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    return { table, outbox };
  };
  const ids = async (table: string) =>
    (await pool.query(`SELECT id FROM "${table}" ORDER BY id`)).rows.map((row) => row.id as string);
  const databaseNow = async () => (await pool.query('SELECT clock_timestamp() AS t')).rows[0].t as Date;
  /** Each row's status, dead_reason, and whether dead_at falls within [from, to] (null: no dead_at). */
  const deaths = async (table: string, from: Date, to: Date) =>
    Object.fromEntries(
      (
        await pool.query(
          `SELECT id, status, dead_reason, CASE WHEN dead_at IS NULL THEN NULL ELSE dead_at BETWEEN $1 AND $2 END AS dead_now
             FROM "${table}" ORDER BY id`,
          [from, to],
        )
      ).rows.map((row) => [row.id, [row.status, row.dead_reason, row.dead_now]]),
    );

  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    server.close();
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it('is set by the claim that finds a row past maxAttempts or its horizon, and by a failed last attempt', async () => {
    const { table, outbox } = await fresh('claim');
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, created_at) VALUES
         ('maxed', $1, '\\x7b7d', 3, now()),
         ('past_horizon', $1, '\\x7b7d', 1, now() - interval '2 hours'),
         ('last_try', $1, '\\x7b7d', 2, now()),
         ('fresh', $1, '\\x7b7d', 0, now())`,
      [`${base}/fail`],
    );
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 3, horizon: '1h' }, random: () => 0 });
    const before = await databaseNow();
    expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 4, dead: 3, retrying: 1 });
    expect(await deaths(table, before, await databaseNow())).toEqual({
      fresh: ['pending', null, null],
      last_try: ['dead', 'max-attempts', true],
      maxed: ['dead', 'max-attempts', true],
      past_horizon: ['dead', 'horizon', true],
    });
  });

  it('is set by a 410 on the answered row and on every waiting row of its URL', async () => {
    const { table, outbox } = await fresh('gone');
    for (const id of ['a', 'b', 'c']) await outbox.add(pool, { id, url: `${base}/gone`, body: '{}' });
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now() + interval '1 hour' WHERE id <> 'a'`);
    const before = await databaseNow();
    const sender = createSender({ secret: SECRET, random: () => 0 });
    expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, dead: 3 });
    expect(await deaths(table, before, await databaseNow())).toEqual({
      a: ['dead', 'gone', true],
      b: ['dead', 'gone', true],
      c: ['dead', 'gone', true],
    });
  });

  it("is set by a takeover whose wait would pass the horizon, and by a 429's hold past a row's horizon", async () => {
    const { table, outbox } = await fresh('takeover');
    // crashed: its relay died mid-attempt; the backoff wait after the takeover (random 1: the whole
    // base of an hour) ends past its horizon. held: a waiting row of the URL that answers 429,
    // whose horizon ends before the hold does.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, claims, created_at, locked_by, locked_until, next_attempt_at) VALUES
         ('crashed', $1, '\\x7b7d', 1, 1, now() - interval '30 minutes', 'dead-relay', now() - interval '1 second', now()),
         ('asked', $2, '\\x7b7d', 0, 0, now(), NULL, NULL, now()),
         ('held', $2, '\\x7b7d', 1, 1, now() - interval '59 minutes', NULL, NULL, now() + interval '1 second')`,
      [`${base}/fail`, `${base}/busy`],
    );
    const sender = createSender({
      secret: SECRET,
      schedule: { base: '1h', cap: '1h', horizon: '1h' },
      random: () => 0.999,
    });
    const before = await databaseNow();
    await outbox.relay({ db: pool, sender }).runOnce();
    expect(await deaths(table, before, await databaseNow())).toEqual({
      asked: ['pending', null, null],
      crashed: ['dead', 'horizon', true],
      held: ['dead', 'horizon', true],
    });
  });

  it('is cleared by requeue(), and deadLetters() gives it as deadAt (null for a row that never had one)', async () => {
    const { table, outbox } = await fresh('requeue');
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, dead_at) VALUES
         ('died', $1, '\\x7b7d', 'dead', 'gone', now() - interval '2 days', now() - interval '1 day'),
         ('legacy', $1, '\\x7b7d', 'dead', 'gone', now() - interval '1 day', NULL)`,
      [`${base}/gone`],
    );
    const { rows: stored } = await pool.query(`SELECT dead_at FROM "${table}" WHERE id = 'died'`);
    const page = await outbox.deadLetters(pool);
    expect(page.rows.map((row) => [row.id, row.deadAt])).toEqual([
      ['died', stored[0].dead_at],
      ['legacy', null],
    ]);
    expect(page.rows[0]?.deadAt).toBeInstanceOf(Date);

    expect(await outbox.requeue(pool, 'died')).toBe(true);
    const { rows } = await pool.query(`SELECT status, dead_at FROM "${table}" WHERE id = 'died'`);
    expect(rows[0]).toEqual({ status: 'pending', dead_at: null });
  });

  it('purge({ dead: true }) counts from dead_at: a row added a year ago that died yesterday stays', async () => {
    const { table, outbox } = await fresh('purge');
    // Added 400 days ago, attempted, and now past its one-year horizon: the claim dead-letters it.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, created_at) VALUES ('year_old', $1, '\\x7b7d', 1, now() - interval '400 days')`,
      [`${base}/fail`],
    );
    const sender = createSender({ secret: SECRET, schedule: { horizon: '365d' } });
    expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ dead: 1 });
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, requeued_at, dead_at, next_attempt_at) VALUES
         -- died 31 days ago (added long before): goes
         ('died_31d', $1, '\\x7b7d', 'dead', 'gone', now() - interval '300 days', NULL, now() - interval '31 days', now() - interval '31 days'),
         -- died 29 days ago, added and requeued long before: stays
         ('died_29d', $1, '\\x7b7d', 'dead', 'horizon', now() - interval '300 days', now() - interval '200 days', now() - interval '29 days', now() - interval '29 days'),
         -- added yesterday and died at once, with an old dead_at written by hand: dead_at is what counts
         ('died_odd', $1, '\\x7b7d', 'dead', 'gone', now() - interval '1 day', NULL, now() - interval '31 days', now())`,
      [`${base}/fail`],
    );
    expect(await outbox.purge(pool, { olderThan: '30d', dead: true })).toEqual({ deleted: 2 });
    expect(await ids(table)).toEqual(['died_29d', 'year_old']);
    expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(['year_old']);
  });

  it('purge({ dead: true }) ages a row dead before dead_at existed by the later of created_at, requeued_at and next_attempt_at', async () => {
    const { table, outbox } = await fresh('legacy');
    // Rows an earlier version dead-lettered (dead_at NULL). Its last write (the failed last attempt,
    // a 410) set next_attempt_at to when it died, or later (a wait past the horizon).
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, requeued_at, next_attempt_at) VALUES
         ('old', $1, '\\x7b7d', 'dead', 'gone', now() - interval '60 days', NULL, now() - interval '31 days'),
         ('died_late', $1, '\\x7b7d', 'dead', 'horizon', now() - interval '400 days', NULL, now() - interval '2 days'),
         ('requeued', $1, '\\x7b7d', 'dead', 'horizon', now() - interval '400 days', now() - interval '29 days', now() - interval '40 days'),
         ('young', $1, '\\x7b7d', 'dead', 'gone', now() - interval '29 days', NULL, now() - interval '40 days')`,
      [`${base}/fail`],
    );
    expect(await outbox.purge(pool, { olderThan: '30d', dead: true })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(['died_late', 'requeued', 'young']);
  });

  it('a dead_at older than requeued_at (requeued and dead-lettered again by an earlier version) is not taken as the death', async () => {
    const { table, outbox } = await fresh('stale');
    // During a rolling upgrade a relay of the earlier version requeued the row 10 days ago (its
    // requeue knows no dead_at, so the first death's stays) and dead-lettered it again 5 days ago.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, requeued_at, dead_at, next_attempt_at) VALUES
         ('stale', $1, '\\x7b7d', 'dead', 'horizon', now() - interval '400 days', now() - interval '10 days', now() - interval '60 days', now() - interval '5 days'),
         ('fresh', $1, '\\x7b7d', 'dead', 'gone', now() - interval '400 days', now() - interval '40 days', now() - interval '31 days', now() - interval '31 days')`,
      [`${base}/fail`],
    );
    expect(await outbox.purge(pool, { olderThan: '30d', dead: true })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(['stale']);
    // Nor is it reported as when the row died.
    const [row] = (await outbox.deadLetters(pool)).rows;
    expect(row).toMatchObject({ id: 'stale', deadAt: null });
    // Aged as a row without dead_at is: by the later of requeued_at and next_attempt_at.
    expect(await outbox.purge(pool, { olderThan: '9d', dead: true })).toEqual({ deleted: 0 });
    expect(await outbox.purge(pool, { olderThan: '4d', dead: true })).toEqual({ deleted: 1 });
  });

  it('each dead purge batch is an index scan on a few thousand dead rows (EXPLAIN), and so is a deadLetters() page', async () => {
    const { table, outbox } = await fresh('explain');
    // 3,000 dead with dead_at (half old enough), 3,000 without (dead before the upgrade), 3,000 delivered.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, dead_at, next_attempt_at)
       SELECT 'x' || lpad(g::text, 6, '0'), 'https://p.example/h', '\\x7b7d', 'dead', 'horizon',
              now() - interval '400 days', now() - (g % 60) * interval '1 day', now() - (g % 60) * interval '1 day'
         FROM generate_series(1, 3000) g`,
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, created_at, next_attempt_at)
       SELECT 'l' || lpad(g::text, 6, '0'), 'https://p.example/h', '\\x7b7d', 'dead', 'gone',
              now() - interval '400 days', now() - (g % 60) * interval '1 day'
         FROM generate_series(1, 3000) g`,
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, created_at, delivered_at)
       SELECT 'd' || lpad(g::text, 6, '0'), 'https://p.example/h', '\\x7b7d', 'delivered', now(), now()
         FROM generate_series(1, 3000) g`,
    );
    await pool.query(`ANALYZE "${table}"`);

    type PlanNode = { 'Node Type': string; 'Index Name'?: string; Plans?: PlanNode[] };
    const nodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(nodes)];
    const plans: { text: string; scans: (string | undefined)[][] }[] = [];
    const explaining: Queryable = {
      query: async (text, values) => {
        const { rows } = await pool.query(`EXPLAIN (FORMAT JSON) ${text}`, values);
        const scans = nodes(rows[0]['QUERY PLAN'][0].Plan)
          .filter((node) => /Scan/.test(node['Node Type']))
          .map((node) => [node['Node Type'], node['Index Name']]);
        plans.push({ text, scans });
        return pool.query(text, values);
      },
    };

    // Half of each kind of dead row is older than 30 days (by g % 60): 1,500 or so of each, in
    // batches of 100. A batch small beside the rows old enough, as 1,000 (the default) is beside a
    // production table's: the planner estimates a third of the dead rows past any cutoff, and with
    // a batch near that it sorts them all instead (cheap for so few, but read again every batch).
    const { deleted } = await outbox.purge(explaining, { olderThan: '30d', dead: true, batchSize: 100 });
    expect(deleted).toBe(
      (await pool.query(`SELECT 6000 - count(*)::int AS n FROM "${table}" WHERE status = 'dead'`)).rows[0].n,
    );
    const dead = plans.filter((plan) => plan.text.includes("status = 'dead'"));
    expect(dead.length).toBeGreaterThanOrEqual(30);
    // Both statements: the rows with a dead_at, and those without.
    expect(new Set(dead.map((plan) => plan.text.includes('dead_at IS NULL')))).toEqual(new Set([false, true]));
    for (const plan of dead) {
      expect(plan.scans).toEqual([
        ['Index Scan', `${table}_dead_at`],
        ['Index Scan', `${table}_pkey`],
      ]);
    }

    const page = await outbox.deadLetters(pool, { limit: 100 });
    plans.length = 0;
    await outbox.deadLetters(explaining, { limit: 100, after: page.next });
    expect(plans[0]?.scans).toEqual([['Index Scan', `${table}_dead`]]);
  });

  // The table as the release before dead_at made it (migrate() of 645fd5b, word for word), with its
  // four indexes.
  const oldOutboxTable = async (table: string) => {
    await pool.query(`
      CREATE TABLE "${table}" (
        id text PRIMARY KEY,
        url text NOT NULL,
        body bytea NOT NULL,
        content_type text NOT NULL DEFAULT 'application/json',
        headers jsonb NOT NULL DEFAULT '{}'::jsonb,
        status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
        attempts integer NOT NULL DEFAULT 0,
        claims integer NOT NULL DEFAULT 0,
        created_at timestamptz NOT NULL DEFAULT now(),
        requeued_at timestamptz,
        next_attempt_at timestamptz NOT NULL DEFAULT now(),
        locked_until timestamptz,
        locked_by text,
        delivered_at timestamptz,
        dead_reason text,
        last_attempt jsonb,
        history jsonb NOT NULL DEFAULT '[]'::jsonb
      );
      CREATE INDEX "${table}_due" ON "${table}" (next_attempt_at) WHERE status = 'pending';
      CREATE INDEX "${table}_url" ON "${table}" (url, next_attempt_at) WHERE status = 'pending';
      CREATE INDEX "${table}_delivered" ON "${table}" (delivered_at) WHERE status = 'delivered';
      CREATE INDEX "${table}_dead" ON "${table}" (created_at, id) WHERE status = 'dead';`);
    // Dead-lettered by that release: by a 410 60 days ago, and at a one-year horizon 2 days ago
    // (the failed attempt that passed it set next_attempt_at to its wait, then). One still retrying.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, dead_reason, attempts, created_at, next_attempt_at) VALUES
         ('gone_60d', $1, '\\x7b7d', 'dead', 'gone', 1, now() - interval '61 days', now() - interval '60 days'),
         ('horizon_2d', $1, '\\x7b7d', 'dead', 'horizon', 900, now() - interval '367 days', now() - interval '2 days'),
         ('retrying', $1, '\\x7b7d', 'pending', NULL, 900, now() - interval '400 days', now())`,
      [`${base}/fail`],
    );
  };
  const filenode = async (table: string) =>
    (await pool.query(`SELECT pg_relation_filenode($1::regclass) AS n`, [`"${table}"`])).rows[0].n as string;

  it('a table of the release before: migrate() adds dead_at and its index without rewriting a row; its dead rows keep deadAt null and are aged as before', async () => {
    const table = uniqueTable('dead_at_upgrade');
    tables.push(table);
    await oldOutboxTable(table);
    const outbox = createOutbox({ table });
    const sender = createSender({ secret: SECRET, schedule: { horizon: '365d' } });
    // Before migrate(): add() works as it did; the relay, deadLetters() and purge() need the column.
    expect(await outbox.add(pool, { id: 'added_before', url: `${base}/fail`, body: '{}' })).toEqual({
      id: 'added_before',
      added: true,
    });
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now() + interval '1 day' WHERE id = 'added_before'`);
    await expect(outbox.relay({ db: pool, sender }).runOnce()).rejects.toMatchObject({ code: '42703' });
    await expect(outbox.purge(pool, { olderThan: '30d', dead: true })).rejects.toMatchObject({ code: '42703' });

    const before = await filenode(table);
    await outbox.migrate(pool);
    expect(await filenode(table)).toBe(before);
    const { rows: indexes } = await pool.query(
      `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1 AND indexname = $1 || '_dead_at'`,
      [table],
    );
    expect(indexes.map((index) => index.indexdef.replace(/^.* USING /, ''))).toEqual([
      `btree (dead_at, next_attempt_at) WHERE (status = 'dead'::text)`,
    ]);

    const page = await outbox.deadLetters(pool);
    expect(page.rows.map((row) => [row.id, row.deadAt])).toEqual([
      ['horizon_2d', null],
      ['gone_60d', null],
    ]);
    // The retrying row, attempted 900 times over 400 days, is past its horizon: it dies now.
    expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
    expect((await outbox.deadLetters(pool)).rows.find((row) => row.id === 'retrying')?.deadAt).toBeInstanceOf(Date);

    // 30 days: the row dead 60 days ago goes; the one dead at its horizon 2 days ago and the one
    // that died just now stay, though both were added over a year ago.
    expect(await outbox.purge(pool, { olderThan: '30d', dead: true })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(['added_before', 'horizon_2d', 'retrying']);
  });

  it('the documented statements upgrade a table by hand, after which migrate() finds nothing to do and waits for no writer', async () => {
    const table = uniqueTable('dead_at_by_hand');
    tables.push(table);
    await oldOutboxTable(table);
    // docs/webhooks.md, "Upgrading from an earlier version": the SQL for `webhook_outbox`.
    const docs = readFileSync(new URL('../../../docs/webhooks.md', import.meta.url), 'utf8');
    const block = /For `createOutbox\(\{ table: 'webhook_outbox' \}\)`:\n\n```sql\n([\s\S]*?)```/.exec(docs)?.[1];
    const statements = (block ?? '').trim().split('\n');
    expect(statements.some((statement) => statement.includes('ADD COLUMN IF NOT EXISTS dead_at timestamptz'))).toBe(
      true,
    );
    expect(statements.some((statement) => statement.includes('webhook_outbox_dead_at'))).toBe(true);
    // The test's table names are plain lower-case identifiers, as webhook_outbox is.
    for (const statement of statements) await pool.query(statement.replaceAll('webhook_outbox', table));

    // A writer's transaction stays open across the migrate(): it would wait for it if it had
    // anything left to change.
    const outbox = createOutbox({ table });
    const writer = await pool.connect();
    try {
      await writer.query('BEGIN');
      await outbox.add(writer, { id: 'open', url: `${base}/fail`, body: '{}' });
      await outbox.migrate(pool, { lockTimeout: '100ms', lockWait: '100ms' });
      await writer.query('ROLLBACK');
    } finally {
      writer.release();
    }
    const { rows } = await pool.query(`SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname`, [
      table,
    ]);
    expect(rows.map((row) => row.indexname.slice(table.length))).toEqual([
      '_dead',
      '_dead_at',
      '_delivered',
      '_due',
      '_pkey',
      '_url',
    ]);
    expect(await outbox.purge(pool, { olderThan: '30d', dead: true })).toEqual({ deleted: 1 });
  });
});
