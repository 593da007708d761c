// The receiver's idempotency event trail, as the API's (api-events.int.test.ts): by default the events
// an operator must look at on the keyed route `POST /webhook-events/<id>/notes` (Koa `idempotency()`)
// go to stderr, one line each, `receiver: idempotency ...`, naming the record id support computes
// from a ticket with `recordId(principalScope(...), operation, key)`, and never the key, the caller, a
// token or a body. A note added and replayed writes nothing.
//
// The store that fails is the notes' own (the plain table in the database, PGlite or PostgreSQL with
// DATABASE_URL): a trigger refuses the claim of one record id with SQLSTATE 57P03 (cannot_connect_now),
// which the PostgreSQL store takes for the database being unavailable, as a failover leaves it.
import { randomUUID } from 'node:crypto';
import { type IdempotencyEvent, parseIdempotencyKey, principalScope, recordId } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { recordDelivery } from '../src/receiver/events.js';
import { apiTables } from '../src/schema/api-schema.js';
import { postCapturingStderr } from './stderr-lines.js';
import { startTestStack, type TestStack } from './test-stack.js';

const sub = 'admin-events';
const clientId = 'ops-cli';
// Mixed case: the route's operation is its path, lowercased as Koa's routing matches paths.
const eventId = `evt_RcvTrail_${randomUUID().replaceAll('-', '')}`;
const notesPath = `/webhook-events/${eventId}/notes`;
// The record id of this caller's key on the notes route, as the docs' ticketRecordId computes it
// (with the receiver's `perClient` scope; the operation is the route's whole path, lowercased).
const recordOf = (issuer: string, keyHeader: string) => {
  const parsed = parseIdempotencyKey(keyHeader);
  if (!parsed.ok) throw new Error('not a key');
  const scope = principalScope({ iss: issuer, sub, clientId }, { perClient: true });
  if (scope === undefined) throw new Error('no scope');
  return recordId(scope, `POST ${notesPath.toLowerCase()}`, parsed.key);
};

describe('the receiver logs the idempotency events an operator must see, by record id', () => {
  let test: TestStack;
  let token: string;
  const written: string[] = [];

  beforeAll(async () => {
    test = await startTestStack('receiver_events', { seed: false });
    // An event to take notes on, as one verified delivery leaves it.
    await recordDelivery(test.db, eventId);
    token = await test.token({ sub, clientId, roles: ['admin'] });
  }, 60_000);

  afterAll(async () => {
    await test?.close();
  });

  /** Adds a note and returns the response with every line written on stderr while it ran. */
  const send = (keyHeader: string, text: string) =>
    postCapturingStderr(new URL(notesPath, test.stack.gateway.url), { token, keyHeader, body: { text } }, written);

  // Whatever a line says, it names none of what the request carried, nor the driver's message.
  afterAll(() => {
    for (const line of written) {
      expect(line).not.toMatch(/bearer|authorization/i);
      expect(line).not.toContain(token);
      expect(line).not.toMatch(/eyJ[\w-]+\.[\w-]+\./);
      expect(line).not.toContain(sub);
      expect(line).not.toContain(test.issuer);
      expect(line).not.toContain(clientId);
      expect(line).not.toMatch(/secret-note|"text"|k-rcv-events-|audit-driver-message/);
    }
  });

  it('a store error on the notes route is one line with the record id, the operation and the store phase', {
    timeout: 30_000,
  }, async () => {
    const keyHeader = `"k-rcv-events-${randomUUID()}"`;
    const id = recordOf(test.issuer, keyHeader);
    // Only this record's claim fails: the trigger's condition names its id.
    await test.db.query(`
      create or replace function audit_rcvtrail_refuse() returns trigger language plpgsql as $$
      begin
        raise exception 'audit-driver-message: the claim is refused' using errcode = '57P03';
      end $$`);
    await test.db.query(
      `create trigger audit_rcvtrail_refuse before insert on ${apiTables.plainIdempotency}
         for each row when (new.id = '${id}') execute function audit_rcvtrail_refuse()`,
    );
    try {
      const { response, lines } = await send(keyHeader, 'secret-note of an operator');
      expect(response.status).toBe(503);
      const about = lines.filter((line) => line.includes(id));
      expect(about).toHaveLength(1);
      expect(about[0]).toMatch(/^receiver: idempotency store-error /);
      expect(about[0]).toContain(`POST ${notesPath.toLowerCase()}`);
      expect(about[0]).toContain('phase claim');
      expect(about[0]).toContain('StoreUnavailableError');
      expect(about[0]).toContain('(cause 57P03)');
      expect(lines).toEqual(about);
    } finally {
      await test.db.query(`drop trigger audit_rcvtrail_refuse on ${apiTables.plainIdempotency}`);
      await test.db.query('drop function audit_rcvtrail_refuse()');
    }
  });

  it('a note added and its replay write nothing', { timeout: 30_000 }, async () => {
    const keyHeader = `"k-rcv-events-${randomUUID()}"`;
    const first = await send(keyHeader, 'secret-note, the second');
    expect(first.response.status).toBe(201);
    const replay = await send(keyHeader, 'secret-note, the second');
    expect(replay.response.status).toBe(201);
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
    expect([...first.lines, ...replay.lines]).toEqual([]);
  });
});

describe("startResourceStack's onReceiverIdempotencyEvent", () => {
  it('takes every idempotency event of the receiver instead of stderr', { timeout: 60_000 }, async () => {
    const events: IdempotencyEvent[] = [];
    const test = await startTestStack('receiver_events_own', {
      seed: false,
      onReceiverIdempotencyEvent: (event) => events.push(event),
    });
    try {
      await recordDelivery(test.db, eventId);
      const own = await test.token({ sub, clientId, roles: ['admin'] });
      const keyHeader = `"k-rcv-events-${randomUUID()}"`;
      const response = await fetch(new URL(notesPath, test.stack.gateway.url), {
        method: 'POST',
        headers: { authorization: `Bearer ${own}`, 'content-type': 'application/json', 'idempotency-key': keyHeader },
        body: JSON.stringify({ text: 'a note' }),
      });
      await response.arrayBuffer();
      expect(response.status).toBe(201);
      const id = recordOf(test.issuer, keyHeader);
      expect(events.filter((event) => event.id === id).map((event) => event.type)).toEqual(
        expect.arrayContaining(['claim', 'complete']),
      );
    } finally {
      await test.close();
    }
  });
});
