// Docs audit of the changes of db2a6f4..HEAD: claims of today's docs, CHANGELOG entries and TSDoc
// checked against the code. Each test states what a doc promises; both failed when the audit wrote
// them (the code, or another doc, did otherwise) and were fixed. Uses the real PostgreSQL of the
// integration tests (DATABASE_URL) for the relay; skipped loudly when it does not answer.
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { requestFailedCodes } from '@idem/client';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import { type AttemptRecord, createOutbox, createSender } from '@idem/webhooks';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const available = await serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the docs audit relay test',
);
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
const servers: { close(): Promise<void> }[] = [];
async function serve(handler: Handler): Promise<string> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  servers.push({
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}
afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

describe('docs/errors.md, Client (RequestFailedError)', () => {
  // docs/errors.md:23-25 says each package's code table (`requestFailedCodes` in @idem/client among
  // them) is repeated on that page, and docs/errors.md:169-185 is the client's. Today's commit 8cf8b9a
  // added `response_too_large`, `token_failed` and `redirect_unreadable` to `requestFailedCodes` (and
  // to docs/client.md's table) but not to docs/errors.md, whose client table still ends at
  // `invalid_response_body`: a reader matching on `code` from that page has no row, and no "what your
  // code should do", for them (token_failed and redirect_unreadable both mean "retry with error.key").
  it('lists every code of requestFailedCodes in its client table', () => {
    const page = readFileSync(`${root}docs/errors.md`, 'utf8');
    const section = page.slice(page.indexOf('## Client (`RequestFailedError`)'), page.indexOf('## Stores'));
    const rows = new Set([...section.matchAll(/^\| `([a-z_]+)` \|/gm)].map((match) => match[1]));
    expect(Object.keys(requestFailedCodes).filter((code) => !rows.has(code))).toEqual([]);
  });
});

describe.skipIf(!available)('docs/webhooks.md, outbox.relay() `onAttempt`', () => {
  // docs/webhooks.md, the relay options table (`onAttempt` row; changed in 955ee0c): onAttempt's attempt carries "the `waitMs` before the
  // next one when there will be one" (the sender's AttemptRecord.waitMs TSDoc: "how long the sender
  // waited after this attempt before the next one"). The relay adds waitMs whenever the attempt is
  // neither delivered nor stopped by 410/maxAttempts; the horizon is decided afterwards, in SQL, so an
  // attempt whose wait would pass the horizon is told (and stored in last_attempt/history) with a
  // waitMs of 9900 while the row is dead-lettered with reason 'horizon': there is no next attempt.
  // The sender's own send() gets this right (no waitMs when it gives up for the horizon).
  it('tells no waitMs for an attempt after which the row is dead-lettered for the horizon', async () => {
    const url = `${await serve((_req, res) => {
      res.writeHead(500);
      res.end('down');
    })}/hooks`;
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    pool.on('error', () => undefined);
    const table = `idem_docs_today_${Math.random().toString(16).slice(2, 10)}`;
    const outbox = createOutbox({ table });
    try {
      await outbox.migrate(pool);
      // A wait of 9.9 s against a 3 s horizon: the first failure is the last attempt.
      const sender = createSender({
        secret: SECRET,
        timeout: '2s',
        random: () => 0.99,
        schedule: { base: '10s', cap: '10s', horizon: '3s' },
      });
      await outbox.add(pool, { id: 'evt_horizon', url, body: { a: 1 } });
      const told: AttemptRecord[] = [];
      const relay = outbox.relay({ db: pool, sender, onAttempt: (_row, attempt) => void told.push(attempt) });
      const round = await relay.runOnce();
      const { rows } = await pool.query(`SELECT status, dead_reason FROM "${table}"`);
      expect(round.dead).toBe(1);
      expect(rows[0]).toEqual({ status: 'dead', dead_reason: 'horizon' });
      expect(told).toHaveLength(1);
      expect(told[0]?.waitMs, 'waitMs on an attempt no other follows').toBeUndefined();
    } finally {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    }
  });
});
