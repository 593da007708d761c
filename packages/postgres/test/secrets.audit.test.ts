// Audit (branch audit-secrets): what a failed store call hands to onEvent on PGlite (the embedded
// default, in process, so a unit test). security.md: "Nothing secret reaches a message, an event or a
// log ... engine events carry the hashed record id"; response bodies are "the sensitive part".
import { PGlite } from '@electric-sql/pglite';
import { createIdempotency, type IdempotencyEvent } from '@idem/core';
import { reachableText } from '@idem/testkit';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { migrate, postgresStore } from '../src/index.js';

const BODY = '{"card":"4111111111111111","email":"planted-person@example.com"}';

let db: PGlite;

beforeAll(async () => {
  db = new PGlite();
  await migrate(db, { table: 'idem_records' });
});

afterAll(async () => {
  await db?.close();
});

// Was a defect: on PGlite, the store-error event of a failed completion (and complete()'s result) carries
// PGlite's error as `cause`, and PGlite puts the statement's `query` and bound `params` on it: the
// response's headers and its whole body (here a card number and an email address). Any logger that
// serializes the event's error with its cause (pino's err serializer, util.inspect, console.error)
// writes the body to the log; pg's errors carry no parameters, so only PGlite users are hit. Expected:
// the event carries no payload; unavailable.ts could wrap such errors with their message, code and
// severity only (or delete `params`/`query` from the cause).
it('the store-error event of a completion PGlite refuses does not carry the response body', async () => {
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({ store: postgresStore({ client: db }), onEvent: (event) => events.push(event) });
  const started = await engine.begin({ key: 'k-1', scope: 'user-1', operation: 'POST /charges', fingerprint: 'fp' });
  expect(started.kind).toBe('execute');
  if (started.kind !== 'execute') return;
  // A fault the database reports (as a full disk or a demoted primary would): writes are refused.
  await db.query('SET default_transaction_read_only = on');
  try {
    const completed = await engine.complete(started.lease, {
      status: 201,
      headers: { 'content-type': 'application/json' },
      body: new TextEncoder().encode(BODY),
    });
    expect(completed).toMatchObject({ ok: false, reason: 'store-error' });
  } finally {
    await db.query('SET default_transaction_read_only = off');
  }
  const storeErrors = events.filter((event) => event.type === 'store-error');
  expect(storeErrors).toHaveLength(1);
  const reachable = reachableText(storeErrors[0]).join('\n');
  expect(reachable).toContain('read-only transaction'); // the cause is there, as it should be
  expect(reachable).not.toContain('4111111111111111');
  expect(reachable).not.toContain('planted-person@example.com');
});
