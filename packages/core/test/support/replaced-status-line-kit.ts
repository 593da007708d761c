// Shared by the three adapters' replaced-status-line tests, on real PostgreSQL: a transactional
// handler sets a reason phrase (its own, or Koa's default for the status it set) and answers 201,
// then PostgreSQL refuses its COMMIT (a deferred unique key). idem answers 500 transaction_aborted in
// place of the held 201: its status line must be its own, not "500 Created" or "500 Created Fine".

import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { Store } from '@idem/core';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** What a framework's app needs: the store, and the work its handler does before it answers 201 with `reason`. */
export interface ReplacedStatusLineApp {
  store: Store;
  /** The reason phrase the handler sets on its 201 (Koa: none of its own; `ctx.status` sets "Created"). */
  reason: string;
  work: (tx: PostgresTransaction, key: string) => Promise<void>;
}

/** Mounts `transactional: true` idempotency and one POST /charges handler, and listens. */
export type MountReplacedStatusLineApp = (
  app: ReplacedStatusLineApp,
) => Promise<{ url: string; close: () => Promise<void> }>;

interface StatusLine {
  status: number;
  statusMessage: string;
  body: string;
}

function post(url: string, key: string): Promise<StatusLine> {
  return new Promise((resolve, reject) => {
    const bytes = Buffer.from('{"amount":100}');
    const req = http.request(
      url,
      {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': bytes.length, 'idempotency-key': key },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            statusMessage: res.statusMessage ?? '',
            body: Buffer.concat(chunks).toString(),
          }),
        );
      },
    );
    req.on('error', reject);
    req.end(bytes);
  });
}

export async function describeReplacedStatusLine(
  framework: string,
  reason: string,
  mount: MountReplacedStatusLineApp,
): Promise<void> {
  const withPostgres = serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    `the ${framework} replaced-status-line test`,
  );
  describe.runIf(withPostgres)(`${framework} transactional: idem's answer in place of a held one`, () => {
    const run = randomBytes(4).toString('hex');
    const table = `idem_${framework}_status_line_${run}`;
    // Its unique key is checked at COMMIT only.
    const slots = `idem_${framework}_status_line_slots_${run}`;
    let pool: pg.Pool;
    beforeAll(async () => {
      pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
      pool.on('error', () => undefined);
      await migrate(pool, { table });
      await pool.query(`CREATE TABLE "${slots}" (slot text, UNIQUE (slot) DEFERRABLE INITIALLY DEFERRED)`);
    });
    afterAll(async () => {
      for (const name of [table, slots]) await pool.query(`DROP TABLE IF EXISTS "${name}"`);
      await pool.end();
    });

    // Was wrong: the 500 went out as `HTTP/1.1 500 ${reason}`: writeResponse left the reason phrase
    // the handler had set on the response, which Node keeps over a later writeHead without one.
    it(`says "500 Internal Server Error", not "500 ${reason}", when the COMMIT of a handler that set "${reason}" is refused`, async () => {
      let fixed = false;
      const app = await mount({
        store: postgresStore({ client: pool, table }),
        reason,
        work: async (tx, key) => {
          await tx.query(`INSERT INTO "${slots}" (slot) VALUES ($1)${fixed ? '' : ', ($1)'}`, [key]);
        },
      });
      const key = `${framework}-status-line-${run}`;
      try {
        const refused = await post(`${app.url}/charges`, key);
        expect(refused.status).toBe(500);
        expect(JSON.parse(refused.body)).toMatchObject({ code: 'transaction_aborted' });
        expect(refused.statusMessage).toBe('Internal Server Error');
        // The handler's own phrase still goes out with its own answer, and with its replay: the
        // store keeps it (the status_message column).
        fixed = true;
        const ran = await post(`${app.url}/charges`, key);
        expect([ran.status, ran.statusMessage]).toEqual([201, reason]);
        const replayed = await post(`${app.url}/charges`, key);
        expect([replayed.status, replayed.statusMessage]).toEqual([201, reason]);
      } finally {
        await app.close();
      }
    });
  });
}
