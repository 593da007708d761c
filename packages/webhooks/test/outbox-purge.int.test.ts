// outbox.purge(): delivered rows (and dead ones, when asked) older than `olderThan` go, in batches
// of short DELETEs that walk a partial index; pending rows, young rows and rows a requeue holds
// stay. Real PostgreSQL; time is injected by writing the timestamps in SQL, never waited out.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, type Queryable } from '../src/index.js';
import { postgresAvailable, testPool } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox purge');

describe.skipIf(!available)('outbox.purge()', () => {
  const pool = testPool({ max: 8 });
  const tables: string[] = [];
  // A fresh, migrated outbox per test: no test sees another's rows.
  const fresh = async (label: string) => {
    const table = `audit_purge_${label}_${randomBytes(4).toString('hex')}`;
    tables.push(table);
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    return { table, outbox };
  };
  const ids = async (table: string) =>
    (await pool.query(`SELECT id FROM "${table}" ORDER BY id`)).rows.map((row) => row.id as string);
  // `n` delivered rows, delivered `ago` (an SQL interval) before the database's now().
  const delivered = (table: string, prefix: string, n: number, ago: string) =>
    pool.query(
      `INSERT INTO "${table}" (id, url, body, status, created_at, delivered_at)
       SELECT '${prefix}' || lpad(g::text, 6, '0'), 'https://partner.example/hooks', '\\x7b7d', 'delivered',
              now() - interval '${ago}' - interval '1 hour', now() - interval '${ago}'
         FROM generate_series(1, ${n}) g`,
    );
  // A Queryable on the pool that lets a test look at each statement as it runs.
  const watched = (after: (text: string, rowCount: number) => Promise<void> | void): Queryable => ({
    query: async (text, values) => {
      const result = await pool.query(text, values);
      await after(text, result.rowCount ?? 0);
      return result;
    },
  });

  afterAll(async () => {
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it('deletes delivered rows older than olderThan, and dead ones only with dead: true; never pending or young ones', async () => {
    const { table, outbox } = await fresh('ages');
    await pool.query(`
      INSERT INTO "${table}" (id, url, body, status, created_at, delivered_at, requeued_at, locked_until, dead_reason, dead_at, next_attempt_at) VALUES
        -- delivered 31 days ago: goes
        ('d_old', 'https://p.example/h', '\\x7b7d', 'delivered', now() - interval '32 days', now() - interval '31 days', NULL, NULL, NULL, NULL, now()),
        -- added long ago but delivered 29 days ago: the delivery is what counts
        ('d_young', 'https://p.example/h', '\\x7b7d', 'delivered', now() - interval '90 days', now() - interval '29 days', NULL, NULL, NULL, NULL, now()),
        -- a delivered row under a live lease (no statement leaves one so): stays all the same
        ('d_leased', 'https://p.example/h', '\\x7b7d', 'delivered', now() - interval '90 days', now() - interval '60 days', NULL, now() + interval '1 hour', NULL, NULL, now()),
        -- pending, added 100 days ago (a horizon of months): never purged
        ('p_old', 'https://p.example/h', '\\x7b7d', 'pending', now() - interval '100 days', NULL, NULL, NULL, NULL, NULL, now()),
        -- pending with an old delivered_at and dead_at (written by hand, say): the status is what counts
        ('p_odd', 'https://p.example/h', '\\x7b7d', 'pending', now() - interval '100 days', now() - interval '100 days', NULL, NULL, NULL, now() - interval '100 days', now()),
        -- dead 31 days ago: goes with dead: true
        ('x_old', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '32 days', NULL, NULL, NULL, 'horizon', now() - interval '31 days', now() - interval '31 days'),
        -- dead 29 days ago, added 100 days ago and requeued 40 days ago: when it died is what counts
        ('x_requeued', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '100 days', NULL, now() - interval '40 days', NULL, 'horizon', now() - interval '29 days', now() - interval '29 days'),
        -- dead 29 days ago
        ('x_young', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '29 days', NULL, NULL, NULL, 'gone', now() - interval '29 days', now() - interval '29 days'),
        -- dead before dead_at existed, requeued by an earlier version, which moved created_at and left an
        -- older requeued_at: the latest of created_at, requeued_at and next_attempt_at counts
        ('x_legacy', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '29 days', NULL, now() - interval '40 days', NULL, 'horizon', NULL, now() - interval '35 days')
    `);
    const all = await ids(table);

    expect(await outbox.purge(pool, { olderThan: '30d' })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(all.filter((id) => id !== 'd_old'));
    expect(await outbox.purge(pool, { olderThan: '30d' })).toEqual({ deleted: 0 });

    // Milliseconds work as well as a string.
    expect(await outbox.purge(pool, { olderThan: 30 * 86_400_000, dead: true })).toEqual({ deleted: 1 });
    expect(await ids(table)).toEqual(all.filter((id) => id !== 'd_old' && id !== 'x_old'));

    // An olderThan longer than PostgreSQL's timestamps reach back deletes nothing, and does not fail.
    expect(await outbox.purge(pool, { olderThan: '10000000d', dead: true })).toEqual({ deleted: 0 });

    // A shorter olderThan reaches the younger rows; pending and leased ones still stay.
    expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 4 });
    expect(await ids(table)).toEqual(['d_leased', 'p_odd', 'p_old']);
  });

  it('deletes in batches of batchSize, each committed on its own, until a batch deletes fewer', async () => {
    const { table, outbox } = await fresh('batches');
    await delivered(table, 'd', 10, '2 days');
    const batches: number[] = [];
    const leftAfter: number[] = [];
    const db = watched(async (_text, rowCount) => {
      batches.push(rowCount);
      // Read on another connection: a batch is visible as soon as it returns, not at the end.
      leftAfter.push((await ids(table)).length);
    });
    expect(await outbox.purge(db, { olderThan: '1d', batchSize: 3 })).toEqual({ deleted: 10 });
    expect(batches).toEqual([3, 3, 3, 1]);
    expect(leftAfter).toEqual([7, 4, 1, 0]);

    // A count that is a multiple of the batch takes one more, empty, statement to find the end.
    await delivered(table, 'e', 6, '2 days');
    batches.length = 0;
    leftAfter.length = 0;
    expect(await outbox.purge(db, { olderThan: '1d', batchSize: 3 })).toEqual({ deleted: 6 });
    expect(batches).toEqual([3, 3, 0]);
  });

  it('stops between batches once its signal is aborted, and counts what it deleted', async () => {
    const { table, outbox } = await fresh('abort');
    await delivered(table, 'd', 10, '2 days');
    const controller = new AbortController();
    let statements = 0;
    const db = watched(() => {
      if (++statements === 2) controller.abort();
    });
    expect(await outbox.purge(db, { olderThan: '1d', batchSize: 3, signal: controller.signal })).toEqual({
      deleted: 6,
    });
    expect(statements).toBe(2);
    expect(await ids(table)).toHaveLength(4);

    // Aborted before it starts: no statement at all.
    expect(await outbox.purge(db, { olderThan: '1d', signal: controller.signal })).toEqual({ deleted: 0 });
    expect(statements).toBe(2);
  });

  it('leaves a dead row that a requeue holds, and keeps it once the requeue commits; takes it if the requeue rolls back', async () => {
    const { table, outbox } = await fresh('requeue');
    await pool.query(`
      INSERT INTO "${table}" (id, url, body, status, created_at, dead_reason, dead_at) VALUES
        ('x_kept', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '40 days', 'horizon', now() - interval '40 days'),
        ('x_undone', 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '40 days', 'horizon', now() - interval '40 days')`);
    const operator = await pool.connect();
    try {
      // The operator's requeue has turned the row pending but not committed: the purge neither waits
      // for it (SKIP LOCKED) nor deletes the row it would have found dead in its snapshot.
      await operator.query('BEGIN');
      expect(await outbox.requeue(operator, 'x_kept')).toBe(true);
      expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 1 });
      expect(await ids(table)).toEqual(['x_kept']);
      await operator.query('COMMIT');
      expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 0 });
      expect((await pool.query(`SELECT status FROM "${table}"`)).rows).toEqual([{ status: 'pending' }]);

      // A requeue rolled back leaves the row dead, and the next purge takes it.
      await pool.query(
        `UPDATE "${table}" SET status = 'dead', requeued_at = NULL, dead_at = now() - interval '40 days' WHERE id = 'x_kept'`,
      );
      await operator.query('BEGIN');
      expect(await outbox.requeue(operator, 'x_kept')).toBe(true);
      expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 0 });
      await operator.query('ROLLBACK');
      expect(await outbox.purge(pool, { olderThan: '1d', dead: true })).toEqual({ deleted: 1 });
      expect(await ids(table)).toEqual([]);
    } finally {
      await operator.query('ROLLBACK').catch(() => undefined);
      operator.release();
    }
  });

  it('run against requeues and a relay at once, loses no pending row: each row is requeued or purged, never both', async () => {
    const { table, outbox } = await fresh('race');
    const received = new Set<string>();
    const server = createServer((request, response) => {
      received.add(String(request.headers['webhook-id']));
      response.statusCode = 200;
      response.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
    try {
      const deadIds = Array.from({ length: 120 }, (_, i) => `x_${String(i).padStart(3, '0')}`);
      const pendingIds = Array.from({ length: 40 }, (_, i) => `p_${String(i).padStart(3, '0')}`);
      await pool.query(
        `INSERT INTO "${table}" (id, url, body, status, created_at, dead_reason)
         SELECT id, $2, '\\x7b7d', 'dead', now() - interval '40 days', 'horizon' FROM unnest($1::text[]) AS id`,
        [deadIds, url],
      );
      for (const id of pendingIds) await outbox.add(pool, { id, url, body: '{}' });

      const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '5s' }), batchSize: 5 });
      const requeued = new Map<string, boolean>();
      let requeuing = true;
      let purged = 0;
      // Three operators requeue every dead row, in an order of their own, while purges (olderThan 0:
      // every delivered and dead row is old enough) and the relay run.
      const shuffled = [...deadIds].sort(() => Math.random() - 0.5);
      const operators = [0, 1, 2].map(async (lane) => {
        for (const id of shuffled.filter((_, i) => i % 3 === lane)) requeued.set(id, await outbox.requeue(pool, id));
      });
      const purger = (async () => {
        while (requeuing) purged += (await outbox.purge(pool, { olderThan: 0, dead: true, batchSize: 4 })).deleted;
      })();
      const relaying = (async () => {
        while (requeuing) await relay.runOnce();
      })();
      await Promise.all(operators);
      requeuing = false;
      await Promise.all([purger, relaying]);
      // Drain: every row left pending is delivered.
      while ((await relay.runOnce()).claimed > 0);

      const left = new Set(await ids(table));
      const { rows: statuses } = await pool.query(`SELECT DISTINCT status FROM "${table}"`);
      expect(statuses.every((row) => row.status === 'delivered')).toBe(true);
      for (const id of deadIds) {
        // Requeued: it was pending, so it was sent (and may since have been purged as delivered).
        if (requeued.get(id)) expect(received.has(id), id).toBe(true);
        // Not requeued: the purge took it first, and it was never sent.
        else expect(left.has(id) || received.has(id), id).toBe(false);
      }
      for (const id of pendingIds) expect(received.has(id), id).toBe(true);
      const requeuedCount = [...requeued.values()].filter(Boolean).length;
      // Both sides did some of the work (else the race was not run), and no row was counted twice.
      expect(requeuedCount).toBeGreaterThan(0);
      expect(purged).toBeGreaterThanOrEqual(120 - requeuedCount);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it('each batch is an index scan on a table of 50,000 delivered and 50,000 dead rows (EXPLAIN), and so is a deadLetters() page', async () => {
    const { table, outbox } = await fresh('explain');
    await delivered(table, 'd', 50_000, '31 days');
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, created_at, dead_reason, dead_at)
       SELECT 'x' || lpad(g::text, 6, '0'), 'https://p.example/h', '\\x7b7d', 'dead', now() - interval '40 days', 'horizon',
              now() - interval '40 days'
         FROM generate_series(1, 50000) g`,
    );
    for (let i = 0; i < 500; i++) await outbox.add(pool, { id: `p_${i}`, url: 'https://p.example/h', body: '{}' });
    await pool.query(`ANALYZE "${table}"`);

    // Every plan node, flattened: its type and the index or table it reads.
    type PlanNode = { 'Node Type': string; 'Index Name'?: string; 'Relation Name'?: string; Plans?: PlanNode[] };
    const nodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(nodes)];
    const plans: { text: string; nodes: PlanNode[] }[] = [];
    const explaining = (stopAfter: (text: string) => boolean, controller: AbortController): Queryable => ({
      query: async (text, values) => {
        const { rows } = await pool.query(`EXPLAIN (FORMAT JSON) ${text}`, values);
        plans.push({ text, nodes: nodes(rows[0]['QUERY PLAN'][0].Plan) });
        const result = await pool.query(text, values);
        if (stopAfter(text)) controller.abort();
        return result;
      },
    });
    const scans = (plan: (typeof plans)[number]) =>
      plan.nodes
        .filter((node) => /Scan/.test(node['Node Type']))
        .map((node) => [node['Node Type'], node['Index Name']]);

    // Delivered rows: two batches of the 50,000 are enough to see the plan.
    let controller = new AbortController();
    let batches = 0;
    const first = await outbox.purge(
      explaining(() => ++batches === 2, controller),
      { olderThan: '30d', signal: controller.signal },
    );
    expect(first).toEqual({ deleted: 2000 });
    for (const plan of plans) {
      expect(scans(plan)).toEqual([
        ['Index Scan', `${table}_delivered`],
        ['Index Scan', `${table}_pkey`],
      ]);
    }

    // Dead rows (the delivered ones are too young for this olderThan: that batch finds none at once,
    // on the index too).
    plans.length = 0;
    controller = new AbortController();
    const second = await outbox.purge(
      explaining((text) => text.includes("status = 'dead'"), controller),
      { olderThan: '35d', dead: true, signal: controller.signal },
    );
    expect(second).toEqual({ deleted: 1000 });
    expect(plans.map(scans)).toEqual([
      [
        ['Index Scan', `${table}_delivered`],
        ['Index Scan', `${table}_pkey`],
      ],
      [
        ['Index Scan', `${table}_dead_at`],
        ['Index Scan', `${table}_pkey`],
      ],
    ]);

    // deadLetters() has its own, in the order the rows were added: a later page starts in it, after
    // the previous page's last row, instead of reading every row before it.
    const page = await outbox.deadLetters(pool, { limit: 100 });
    plans.length = 0;
    await outbox.deadLetters(
      explaining(() => false, new AbortController()),
      { limit: 100, after: page.next },
    );
    expect(scans(plans[0] as (typeof plans)[number])).toEqual([['Index Scan', `${table}_dead`]]);
  });

  it('migrate() gives a table of an earlier version its new indexes once, then takes no lock', async () => {
    const { table, outbox } = await fresh('upgrade');
    const holder = await pool.connect();
    const migrator = await pool.connect();
    const indexDefs = async () =>
      (
        await pool.query(
          `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1 AND indexname <> $2 ORDER BY indexname`,
          [table, `${table}_pkey`],
        )
      ).rows.map((row) => [row.indexname, row.indexdef.replace(/^.* USING /, '')]);
    try {
      // The table as an earlier version's migrate() left it: the due index only.
      await pool.query(`DROP INDEX "${table}_delivered", "${table}_dead", "${table}_url", "${table}_dead_at"`);
      await delivered(table, 'd', 3, '40 days');
      expect(await indexDefs()).toHaveLength(1);

      // With a writer's transaction open, building the missing indexes must wait for it. Each try
      // waits at most lockTimeout, so another add() is held up no longer than that, and after
      // lockWait migrate() gives up with 55P03, having changed nothing.
      await holder.query('BEGIN');
      await outbox.add(holder, { id: 'open', url: 'https://p.example/h', body: '{}' });
      // lockWait below the first pause (250 ms): one try of 200 ms, then it gives up.
      const migrating = outbox.migrate(migrator, { lockTimeout: '200ms', lockWait: '400ms' });
      const gaveUp = expect(migrating).rejects.toMatchObject({ code: '55P03' });
      const other = await pool.connect();
      try {
        await other.query('BEGIN');
        const started = performance.now();
        await outbox.add(other, { id: 'other', url: 'https://p.example/h', body: '{}' });
        expect(performance.now() - started).toBeLessThan(900);
        await other.query('ROLLBACK');
      } finally {
        other.release();
      }
      await gaveUp;
      // With lockTimeout false it waits for the writer as long as it takes, as before.
      const [migratorPid, holderPid] = await Promise.all(
        [migrator, holder].map(async (client) => (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid),
      );
      const waiting = outbox.migrate(migrator, { lockTimeout: false }).then(() => 'migrated' as const);
      // Waiting: the server has the migrator blocked on the writer's lock.
      const blocked = expect
        .poll(
          async () =>
            (await pool.query('SELECT $2::int = ANY(pg_blocking_pids($1)) AS blocked', [migratorPid, holderPid]))
              .rows[0].blocked,
        )
        .toBe(true)
        .then(() => 'waiting' as const);
      const early = await Promise.race([waiting, blocked]);
      expect(early).toBe('waiting');
      await holder.query('ROLLBACK');
      expect(await waiting).toBe('migrated');

      await Promise.all([outbox.migrate(pool), outbox.migrate(pool)]);
      expect(await indexDefs()).toEqual([
        [`${table}_dead`, `btree (created_at, id) WHERE (status = 'dead'::text)`],
        [`${table}_dead_at`, `btree (dead_at, next_attempt_at) WHERE (status = 'dead'::text)`],
        [`${table}_delivered`, `btree (delivered_at) WHERE (status = 'delivered'::text)`],
        [`${table}_due`, `btree (next_attempt_at) WHERE (status = 'pending'::text)`],
        [`${table}_url`, `btree (url, next_attempt_at) WHERE (status = 'pending'::text)`],
      ]);
      expect(await outbox.purge(pool, { olderThan: '30d' })).toEqual({ deleted: 3 });

      // Up to date: the same open writer's transaction no longer holds migrate() up.
      await holder.query('BEGIN');
      await outbox.add(holder, { id: 'open', url: 'https://p.example/h', body: '{}' });
      await outbox.migrate(migrator);
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined);
      holder.release();
      migrator.release(true);
    }
  });

  it('migrate() builds no second index where one of another name does the same work', async () => {
    const { table, outbox } = await fresh('own');
    // The index the docs used to tell users to add for deadLetters(), under their own name, and one
    // for delivered rows made by hand, CONCURRENTLY, as the upgrade notes suggest for a large table.
    await pool.query(`DROP INDEX "${table}_delivered", "${table}_dead"`);
    await pool.query(`CREATE INDEX "${table}_mine" ON "${table}" (created_at, id) WHERE status = 'dead'`);
    await pool.query(
      `CREATE INDEX CONCURRENTLY "${table}_by_hand" ON "${table}" (delivered_at) WHERE (status = 'delivered')`,
    );
    await outbox.migrate(pool);
    const { rows } = await pool.query(`SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname`, [
      table,
    ]);
    expect(rows.map((row) => row.indexname)).toEqual([
      `${table}_by_hand`,
      `${table}_dead_at`,
      `${table}_due`,
      `${table}_mine`,
      `${table}_pkey`,
      `${table}_url`,
    ]);

    // A look-alike that does not do the work (another predicate) does not count.
    await pool.query(`DROP INDEX "${table}_mine"`);
    await pool.query(`CREATE INDEX "${table}_mine" ON "${table}" (created_at, id) WHERE status <> 'pending'`);
    await outbox.migrate(pool);
    const after = await pool.query(`SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname`, [table]);
    expect(after.rows.map((row) => row.indexname)).toContain(`${table}_dead`);
  });
});
