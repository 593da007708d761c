// Audit (volume): the relay's statements that work on one URL's waiting rows, holdUrl (a 429 or a
// Retry-After) and disableUrl (a 410), on an outbox whose backlog is mostly another URL's. Measured
// on 100,000 pending rows, 90% of them one URL's: a hold of a URL with 1,429 rows read the whole
// pending index and filtered out 98,571 rows (110 ms); a hold or a 410 of any URL cost as much as
// the whole backlog, not as much as that URL's rows. Here 20,000 rows keep it quick; the plan is
// read with EXPLAIN (FORMAT JSON) just before each statement runs, on the values it runs with. Each
// statement runs in batches of at most 1,000 rows, and every batch's plan is read: the later ones
// are given the hold's end instead of reckoning it. A batch's rows are picked in due order, which
// `_due` gives too: with `url = $1` the planner walked it, past every row of the other URL due
// first, when the URL had half the backlog and its rows were due last.
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, type Queryable } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('url index audit');

type PlanNode = {
  'Node Type': string;
  'Index Name'?: string;
  'Relation Name'?: string;
  'Index Cond'?: string;
  Plans?: PlanNode[];
};
const nodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(nodes)];

// The table is read through an index whose condition names the URL (an Index Scan, or a Bitmap
// Index Scan under a Bitmap Heap Scan, as the planner likes), and never read whole.
const expectUrlIndexScan = (plan: PlanNode[]) => {
  expect(plan.map((node) => node['Node Type'])).not.toContain('Seq Scan');
  expect(plan.filter((node) => /\burl >?= /.test(node['Index Cond'] ?? ''))).toHaveLength(1);
};

describe.skipIf(!available)("the relay's statements on one URL's rows, behind a backlog of another URL", () => {
  const pool = testPool({ max: 4 });
  const table = uniqueTable('url_index');
  const outbox = createOutbox({ table });
  const closers: Array<() => Promise<unknown>> = [];

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  const endpoint = async (answer: (response: ServerResponse) => void) => {
    const server = createServer((request, response) => {
      request.resume();
      request.on('end', () => answer(response));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(
      () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    );
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  };

  // 20,000 pending rows of a busy partner, due over the last hour, and `count` of `url`: the oldest
  // of them due first (so a round of one claims it), the others either before the busy partner's
  // or after them.
  const seed = async (url: string, count: number, dueLast = false) => {
    await pool.query(`DELETE FROM "${table}"`);
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       SELECT 'evt_busy_' || n, 'https://busy.example/hooks', convert_to('{}', 'UTF8'), now() - n * interval '150 ms'
         FROM generate_series(1, 20000) AS n`,
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       SELECT 'evt_small_' || n, $1, convert_to('{}', 'UTF8'),
              CASE WHEN n = 1 OR NOT $3 THEN now() - interval '2 hours' + n * interval '1 ms'
                   ELSE now() - interval '1 second' + n * interval '10 us' END
         FROM generate_series(1, $2::int) AS n`,
      [url, count, dueLast],
    );
    await pool.query(`ANALYZE "${table}"`);
  };

  // Runs one round of one row, and returns the plan of each statement `pick` names: `batches` of them.
  const plansOf = async (pick: (text: string) => boolean, batches: number) => {
    const plans: PlanNode[][] = [];
    const db: Queryable = {
      query: async (text, values) => {
        if (pick(text)) {
          const { rows } = await pool.query(`EXPLAIN (FORMAT JSON) ${text}`, values);
          plans.push(nodes(rows[0]['QUERY PLAN'][0].Plan));
        }
        return pool.query(text, values);
      },
    };
    const sender = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5 });
    await outbox.relay({ db, sender, batchSize: 1, lease: '5s' }).runOnce();
    expect(plans).toHaveLength(batches);
    return plans;
  };

  it("a 429's hold finds the URL's rows by an index on the URL, not by reading every pending row", async () => {
    const url = await endpoint((response) => response.writeHead(429, { 'retry-after': '60' }).end());
    await seed(url, 2500);
    for (const plan of await plansOf((text) => text.includes("THEN 'horizon' ELSE dead_reason"), 3)) {
      expectUrlIndexScan(plan);
    }
    const held = await pool.query(
      `SELECT count(*)::int AS n FROM "${table}" WHERE url = $1 AND next_attempt_at > now() + interval '50 seconds'`,
      [url],
    );
    expect(held.rows[0].n).toBe(2500);
  });

  it("a 410's dead-lettering finds the URL's rows by an index on the URL, not by reading every pending row", async () => {
    const url = await endpoint((response) => response.writeHead(410).end());
    await seed(url, 2500);
    for (const plan of await plansOf((text) => text.includes("dead_reason = 'gone'"), 3)) expectUrlIndexScan(plan);
    const dead = await pool.query(`SELECT count(*)::int AS n FROM "${table}" WHERE url = $1 AND status = 'dead'`, [
      url,
    ]);
    expect(dead.rows[0].n).toBe(2500);
  });

  it("a 429's hold of a URL with half the backlog, due after the other's, reads it by the URL too", async () => {
    const url = await endpoint((response) => response.writeHead(429, { 'retry-after': '60' }).end());
    await seed(url, 20_000, true);
    for (const plan of await plansOf((text) => text.includes("THEN 'horizon' ELSE dead_reason"), 20)) {
      expectUrlIndexScan(plan);
    }
  });

  it("a 410's dead-lettering of a URL with half the backlog, due after the other's, reads it by the URL too", async () => {
    const url = await endpoint((response) => response.writeHead(410).end());
    await seed(url, 20_000, true);
    for (const plan of await plansOf((text) => text.includes("dead_reason = 'gone'"), 20)) expectUrlIndexScan(plan);
  });
});
