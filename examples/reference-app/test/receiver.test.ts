import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { principalFromClaims } from '@idem/guard';
import { sign } from '@idem/webhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { findChargeState } from '../src/receiver/charges.js';
import { loadWebhookSecret } from '../src/schema/api-schema.js';
import { startTestStack, type TestStack } from './test-stack.js';

// A charge's payment.succeeded event, from the outbox through the relay to the receiver's inbox.
let test: TestStack;
let db: Database;
let stack: RunningResourceStack;
let issuer: string;
let audience: string;

beforeAll(async () => {
  test = await startTestStack('receiver');
  ({ db, stack, issuer, audience } = test);
  // Starting three servers and a database is slow on a loaded 2-core machine; nothing here waits on time.
}, 60_000);

afterAll(async () => {
  await test?.close();
});

function mint(roles: string[] = [], scope = 'charges:write', clientId?: string): Promise<string> {
  return test.token({ scope, roles, ...(clientId ? { clientId } : {}) });
}

async function createCharge(amount: number): Promise<{ id: string }> {
  const token = await mint();
  const response = await fetch(new URL('/charges', stack.gateway.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ amount, currency: 'EUR' }),
  });
  expect(response.status).toBe(201);
  return (await response.json()) as { id: string };
}

interface EventRow {
  id: string;
  type: string | null;
  chargeId: string | null;
  amount: number | null;
  deliveries: number;
  applied: number;
}

/** The receiver's admin API (Koa), through the gateway, as an admin with the scope `events:read`. */
async function admin(path: string, roles = ['admin'], scope = 'events:read'): Promise<Response> {
  return fetch(new URL(path, stack.gateway.url), {
    headers: { authorization: `Bearer ${await mint(roles, scope)}` },
  });
}

/**
 * Posts a note on an event through the gateway, as a caller with `roles` (default admin) and `scope`;
 * `key` undefined sends none (default: a fresh key). `path` posts somewhere else than the event's notes.
 */
async function postNote(
  eventId: string,
  body: unknown,
  options: { key?: string | undefined; scope?: string; client?: string; roles?: string[]; path?: string } = {
    key: `"${randomUUID()}"`,
  },
): Promise<Response> {
  return fetch(new URL(options.path ?? `/webhook-events/${eventId}/notes`, stack.gateway.url), {
    method: 'POST',
    headers: {
      authorization: `Bearer ${await mint(options.roles ?? ['admin'], options.scope ?? 'events:write', options.client)}`,
      'content-type': 'application/json',
      ...(options.key ? { 'idempotency-key': options.key } : {}),
    },
    body: JSON.stringify(body),
  });
}

/** The notes an admin sees on one event. */
async function notesOf(eventId: string): Promise<unknown[]> {
  return ((await (await admin(`/webhook-events/${eventId}`)).json()) as { notes: unknown[] }).notes;
}

async function events(): Promise<EventRow[]> {
  const response = await admin('/webhook-events');
  expect(response.status).toBe(200);
  return ((await response.json()) as { events: EventRow[] }).events;
}

async function eventOf(chargeId: string): Promise<EventRow | undefined> {
  return (await events()).find((event) => event.chargeId === chargeId);
}

describe('payment.succeeded: delivered at least once, applied once', () => {
  it('the relay delivers a committed charge to the receiver, which applies it once', async () => {
    const charge = await createCharge(4200);
    expect(await eventOf(charge.id)).toBeUndefined();
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBeGreaterThanOrEqual(1);
    expect(await eventOf(charge.id)).toMatchObject({
      id: `evt_${charge.id}`,
      type: 'payment.succeeded',
      amount: 4200,
      deliveries: 1,
      applied: 1,
    });
    const { rows } = await db.query<{ status: string }>('select status from api_webhook_outbox where id = $1', [
      `evt_${charge.id}`,
    ]);
    expect(rows[0]?.status).toBe('delivered');
  });

  it('a second delivery of the same event (a relay that died before recording) is not applied again', async () => {
    const charge = await createCharge(990);
    await stack.api.relayOnce();
    // What a crash between the receiver's 200 and the outbox update leaves: the row is pending again.
    await db.query(
      `update api_webhook_outbox set status = 'pending', next_attempt_at = now(), locked_until = null where id = $1`,
      [`evt_${charge.id}`],
    );
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBe(1);
    expect(await eventOf(charge.id)).toMatchObject({ deliveries: 2, applied: 1 });
  });

  it('the events page shows deliveries and "once"', async () => {
    const charge = await createCharge(1234);
    await stack.api.relayOnce();
    const response = await fetch(stack.receiver.pageUrl);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    const html = await response.text();
    const row = html.split('<tr').find((part) => part.includes(`evt_${charge.id}`));
    expect(row).toBeDefined();
    expect(row).toContain('<td class="deliveries">1</td>');
    expect(row).toContain('<td class="applied">once</td>');
  });
});

// Spec part 6: "The sender retries an event until it is acknowledged." The library's sender gives up
// after 24 hours by default; the reference app's (src/webhook-schedule.ts) goes on for a year, and its
// receiver remembers ids longer than that, so a receiver down for a month still gets the event, once.
describe('payment.succeeded: retried until acknowledged (spec part 6)', () => {
  // A charge whose first delivery fails: the receiver cannot apply anything while its table is away,
  // so it answers with an error, not 2xx.
  async function chargeFirstRefused(amount: number) {
    await stack.api.relayOnce();
    const charge = await createCharge(amount);
    await db.exec('alter table receiver_events rename to receiver_events_away');
    try {
      expect((await stack.api.relayOnce()).delivered).toBe(0);
    } finally {
      await db.exec('alter table receiver_events_away rename to receiver_events');
    }
    return { charge, eventId: `evt_${charge.id}` };
  }

  it('still delivers an event whose receiver failed for a month, once it answers again, and applies it once', async () => {
    const { charge, eventId } = await chargeFirstRefused(2468);
    // A month of failed attempts later (the outbox counts its horizon from the row's creation, by the
    // database clock), the next attempt is due, and the receiver is back.
    await db.query(
      `update api_webhook_outbox set created_at = created_at - interval '30 days', next_attempt_at = now()
        where id = $1`,
      [eventId],
    );
    for (let round = 0; round < 3; round++) {
      await stack.api.relayOnce();
      await db.query(`update api_webhook_outbox set next_attempt_at = now() where id = $1 and status = 'pending'`, [
        eventId,
      ]);
    }
    const { rows } = await db.query<{ status: string }>('select status from api_webhook_outbox where id = $1', [
      eventId,
    ]);
    expect(rows[0]?.status).toBe('delivered');
    expect(await eventOf(charge.id)).toMatchObject({ id: eventId, applied: 1 });
    // The receiver remembers the id for longer than the sender could still retry it: the record of
    // the delivery outlives the year of the sender's horizon (by the database clock, as both count).
    const kept = await db.query<{ outlives: boolean }>(
      "select min(expires_at) > now() + interval '365 days' as outlives from receiver_inbox_records",
    );
    expect(kept.rows[0]?.outlives).toBe(true);
  });

  it('gives up on an event only past the horizon of a year: dead-lettered, never sent again', async () => {
    const { charge, eventId } = await chargeFirstRefused(1357);
    await db.query(
      `update api_webhook_outbox set created_at = created_at - interval '366 days', next_attempt_at = now()
        where id = $1`,
      [eventId],
    );
    await stack.api.relayOnce();
    const { rows } = await db.query<{ status: string; dead_reason: string | null }>(
      'select status, dead_reason from api_webhook_outbox where id = $1',
      [eventId],
    );
    expect(rows[0]).toMatchObject({ status: 'dead', dead_reason: 'horizon' });
    expect(await eventOf(charge.id)).toBeUndefined();
  });
});

describe('receiver: what is refused', () => {
  const webhook = () => stack.receiver.webhookUrl;

  it.each([
    ['no token', ''],
    ['a wrong token', '?token=not-the-token'],
    // 256 bits of zeros: the token is random, not a constant anyone could know.
    ['a guessable token', `?token=${'A'.repeat(43)}`],
    ['the token twice', () => `?${new URL(stack.receiver.pageUrl).search.slice(1)}&token=x`],
  ])('shows the events page to nobody with %s: 403, no event in it', async (_name, query) => {
    const charge = await createCharge(4321);
    await stack.api.relayOnce();
    const response = await fetch(new URL(`/${typeof query === 'string' ? query : query()}`, stack.receiver.url));
    expect(response.status).toBe(403);
    expect(response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    expect(response.headers.get('cache-control')).toBe('no-store');
    const html = await response.text();
    expect(html).not.toContain(charge.id);
    expect(html).not.toContain('<table');
  });

  it('refuses an unsigned or wrongly signed delivery and records nothing', async () => {
    const id = `evt_forged_${randomUUID()}`;
    const body = JSON.stringify({ type: 'payment.succeeded', data: { id: 'ch_forged', amount: 1, currency: 'EUR' } });
    const wrong = sign({
      id,
      timestamp: Math.floor(Date.now() / 1000),
      body,
      secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
    });
    const response = await fetch(webhook(), {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...wrong },
      body,
    });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: 'signature_mismatch' });
    const unsigned = await fetch(webhook(), { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(unsigned.status).toBe(400);
    expect((await events()).find((event) => event.id === id)).toBeUndefined();
  });

  it('applies an event once when its deliveries arrive concurrently', async () => {
    const secret = await loadWebhookSecret(db);
    const id = `evt_burst_${randomUUID()}`;
    const body = JSON.stringify({ type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 5, currency: 'EUR' } });
    const headers = {
      'content-type': 'application/json',
      ...sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret }),
    };
    const statuses = await Promise.all(
      Array.from({ length: 5 }, async () => (await fetch(webhook(), { method: 'POST', headers, body })).status),
    );
    // 409 tells the sender to retry later; every other answer is the acknowledgement.
    expect(statuses.every((status) => status === 200 || status === 409)).toBe(true);
    expect(statuses).toContain(200);
    expect((await events()).find((event) => event.id === id)).toMatchObject({ applied: 1, deliveries: 5 });
  }, 60_000);

  it('refuses the same event id with another body (422) and keeps the first effect', async () => {
    const secret = await loadWebhookSecret(db);
    const id = `evt_reuse_${randomUUID()}`;
    const post = async (amount: number) => {
      const body = JSON.stringify({ type: 'payment.succeeded', data: { id: `ch_${id}`, amount, currency: 'EUR' } });
      const headers = sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret });
      return fetch(webhook(), { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    };
    expect((await post(10)).status).toBe(200);
    expect((await post(10)).status).toBe(200);
    expect((await post(11)).status).toBe(422);
    expect((await events()).find((event) => event.id === id)).toMatchObject({ amount: 10, applied: 1, deliveries: 3 });
  });
});

describe('out of order: a stale event is acknowledged but does not roll the charge back (events case 32)', () => {
  async function post(id: string, payload: unknown): Promise<Response> {
    const secret = await loadWebhookSecret(db);
    const body = JSON.stringify(payload);
    const headers = sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret });
    return fetch(stack.receiver.webhookUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body,
    });
  }
  const refund = (chargeId: string) => ({
    type: 'payment.refunded',
    data: { id: chargeId, status: 'refunded', version: 2 },
  });

  it("keeps v2 (refunded) when the API's payment.succeeded (v1) arrives after it; both are acknowledged and applied once", async () => {
    const charge = await createCharge(3100);
    // The refund overtakes the success, which is still waiting in the API's outbox.
    const refunded = await post(`evt_re_${charge.id}`, refund(charge.id));
    expect(refunded.status).toBe(200);
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'refunded', version: 2 });
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBeGreaterThanOrEqual(1);
    expect(await eventOf(charge.id)).toBeDefined();
    expect(await findChargeState(db, charge.id)).toEqual({
      chargeId: charge.id,
      status: 'refunded',
      version: 2,
      eventId: `evt_re_${charge.id}`,
    });
    const both = (await events()).filter((event) => event.chargeId === charge.id);
    expect(both.map((event) => [event.id, event.applied]).sort()).toEqual([
      [`evt_${charge.id}`, 1],
      [`evt_re_${charge.id}`, 1],
    ]);
  });

  it('in order, the newer event replaces the older one; a redelivered stale event changes nothing', async () => {
    const charge = await createCharge(3200);
    await stack.api.relayOnce();
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'succeeded', version: 1 });
    expect((await post(`evt_re_${charge.id}`, refund(charge.id))).status).toBe(200);
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'refunded', version: 2 });
    // A v1 event under a new id (not a duplicate the inbox would absorb) is still stale.
    const late = await post(`evt_late_${charge.id}`, {
      type: 'payment.succeeded',
      data: { id: charge.id, status: 'succeeded', version: 1 },
    });
    expect(late.status).toBe(200);
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'refunded', version: 2 });
  });

  it('refuses a refund without a version (only payment.succeeded may omit it): 500, nothing applied, the sender retries', async () => {
    const charge = await createCharge(3300);
    await stack.api.relayOnce();
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'succeeded', version: 1 });
    // Counted as version 1, it would lose to the success and be acknowledged: a refund lost in silence.
    const versionless = { type: 'payment.refunded', data: { id: charge.id, status: 'refunded' } };
    const refused = await post(`evt_re_${charge.id}`, versionless);
    expect(refused.status).toBe(500);
    expect(await refused.json()).toMatchObject({ code: 'apply_failed', retryable: true });
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'succeeded', version: 1 });
    expect((await events()).find((event) => event.id === `evt_re_${charge.id}`)?.applied ?? 0).toBe(0);
    // So is a version that is not a positive integer, whatever the type.
    for (const [i, version] of ['2', 0, 1.5].entries()) {
      const bad = await post(`evt_bad_${i}_${charge.id}`, {
        type: 'payment.succeeded',
        data: { id: charge.id, status: 'succeeded', version },
      });
      expect(bad.status).toBe(500);
    }
    // The sender fixed, its retry under the same id is applied.
    expect((await post(`evt_re_${charge.id}`, refund(charge.id))).status).toBe(200);
    expect(await findChargeState(db, charge.id)).toMatchObject({ status: 'refunded', version: 2 });
  });
});

describe("receiver admin API (Koa, @idem/koa's internalAuth and authorize, behind the gateway)", () => {
  it('shows one event to an admin, and 404 problem+json for an id it never saw', async () => {
    const charge = await createCharge(77);
    await stack.api.relayOnce();
    const one = await admin(`/webhook-events/evt_${charge.id}`);
    expect(one.status).toBe(200);
    expect(one.headers.get('cache-control')).toBe('no-store');
    expect(await one.json()).toMatchObject({ id: `evt_${charge.id}`, amount: 77, deliveries: 1, applied: 1 });
    const unknown = await admin('/webhook-events/evt_never_seen');
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get('content-type')).toContain('application/problem+json');
    expect(await unknown.json()).toMatchObject({ code: 'event_not_found' });
  });

  it('refuses a caller without the admin role with 403 insufficient_scope', async () => {
    const response = await admin('/webhook-events', []);
    expect(response.status).toBe(403);
    expect(response.headers.get('www-authenticate')).toContain('error="insufficient_scope"');
  });

  it('refuses an admin whose token lacks the scope events:read: the role alone is not enough', async () => {
    for (const path of ['/webhook-events', '/webhook-events/evt_never_seen']) {
      const response = await admin(path, ['admin'], 'charges:write events:write');
      expect(response.status).toBe(403);
      expect(response.headers.get('www-authenticate')).toContain('scope="events:read"');
    }
  });

  it('refuses a note from an admin whose token lacks the scope events:write', async () => {
    const charge = await createCharge(57);
    await stack.api.relayOnce();
    const response = await postNote(
      `evt_${charge.id}`,
      { text: 'Looked at it' },
      { key: `"${randomUUID()}"`, scope: 'events:read' },
    );
    expect(response.status).toBe(403);
    expect(response.headers.get('www-authenticate')).toContain('scope="events:write"');
    expect(await notesOf(`evt_${charge.id}`)).toEqual([]);
  });

  it('refuses a note from a caller with events:write but without the admin role: the scope alone is not enough', async () => {
    const charge = await createCharge(62);
    await stack.api.relayOnce();
    const response = await postNote(
      `evt_${charge.id}`,
      { text: 'Not an admin' },
      { key: `"${randomUUID()}"`, roles: [] },
    );
    expect(response.status).toBe(403);
    expect(response.headers.get('www-authenticate')).toContain('error="insufficient_scope"');
    expect(await notesOf(`evt_${charge.id}`)).toEqual([]);
  });

  it('adds notes only under /notes: a POST to the event itself is 405, and adds nothing', async () => {
    const charge = await createCharge(63);
    await stack.api.relayOnce();
    const response = await postNote(
      `evt_${charge.id}`,
      { text: 'Posted to the event' },
      { key: `"${randomUUID()}"`, path: `/webhook-events/evt_${charge.id}` },
    );
    expect(response.status).toBe(405);
    expect(response.headers.get('allow')).toBe('GET, HEAD, OPTIONS');
    expect(await response.json()).toMatchObject({ code: 'method_not_allowed', status: 405 });
    expect(await notesOf(`evt_${charge.id}`)).toEqual([]);
  });

  it('answers a method a path does not take with 405 and Allow, after the caller is authenticated', async () => {
    const token = await mint(['admin'], 'events:read events:write');
    const call = (method: string, path: string, base = stack.gateway.url, auth = true) =>
      fetch(new URL(path, base), { method, headers: auth ? { authorization: `Bearer ${token}` } : {} });
    for (const [method, path, allow] of [
      ['DELETE', '/webhook-events', 'GET, HEAD, OPTIONS'],
      ['PUT', '/webhook-events/evt_1', 'GET, HEAD, OPTIONS'],
      ['GET', '/webhook-events/evt_1/notes', 'POST, OPTIONS'],
    ] as const) {
      const response = await call(method, path);
      expect(response.status, `${method} ${path}`).toBe(405);
      expect(response.headers.get('allow'), `${method} ${path}`).toBe(allow);
      expect(await response.json()).toMatchObject({ code: 'method_not_allowed' });
    }
    expect((await call('HEAD', '/webhook-events')).status).toBe(200);
    const options = await call('OPTIONS', '/webhook-events/evt_1/notes');
    expect(options.status).toBe(204);
    expect(options.headers.get('allow')).toBe('POST, OPTIONS');
    // Deeper than any route: still no route.
    expect((await call('DELETE', '/webhook-events/evt_1/notes/2')).status).toBe(404);
    // Straight to the receiver without the internal token: 401 first, the route is not told.
    expect((await call('DELETE', '/webhook-events', stack.receiver.url, false)).status).toBe(401);
    // The webhook path and the page take their own methods.
    const webhook = await call('GET', stack.receiver.webhookUrl, stack.receiver.url, false);
    expect(webhook.status).toBe(405);
    expect(webhook.headers.get('allow')).toBe('POST, OPTIONS');
    const page = await call('DELETE', '/', stack.receiver.url, false);
    expect(page.status).toBe(405);
    expect(page.headers.get('allow')).toBe('GET, HEAD, OPTIONS');
    // HEAD is the page's, as GET is: without the page token, the same 403 (it was a 404).
    expect((await call('HEAD', '/', stack.receiver.url, false)).status).toBe(403);
  });

  it.each(['%00', 'evt_1%00', 'evt.1'])(
    'answers 404 event_not_found for an id no event can have (%s), not a 500',
    async (id) => {
      const response = await admin(`/webhook-events/${id}`);
      expect(response.status).toBe(404);
      expect(await response.json()).toMatchObject({ code: 'event_not_found' });
    },
  );

  it('refuses a call through the gateway without a token (401), before it reaches the receiver', async () => {
    const response = await fetch(new URL('/webhook-events', stack.gateway.url));
    expect(response.status).toBe(401);
  });

  it("refuses a direct call to the receiver's port without the gateway's internal token (401)", async () => {
    const response = await fetch(new URL('/webhook-events', stack.receiver.url));
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toMatch(/^Bearer /);
    expect(await response.json()).toMatchObject({ code: 'token_missing' });
  });

  it("refuses the gateway's internal token minted for the API: each service takes only its own audience", async () => {
    const token = await stack.gateway.internalIssuer.mint(
      principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience, roles: ['admin'] }),
      { audience: 'reference-api' },
    );
    const response = await fetch(new URL('/webhook-events', stack.receiver.url), {
      headers: { 'idem-internal-token': token },
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toMatchObject({ code: 'audience_invalid' });
  });

  it("adds a note once per Idempotency-Key (@idem/koa's idempotency): a retry replays, a new key adds another", async () => {
    const charge = await createCharge(55);
    await stack.api.relayOnce();
    const note = (key: string | undefined, text = 'Customer called about this one') =>
      postNote(`evt_${charge.id}`, { text }, { key });
    const first = await note('"note-1"');
    expect(first.status).toBe(201);
    const created = (await first.json()) as { id: number; author: string; text: string };
    // The author is the admin the internal token names, never a name the client sent.
    expect(created).toMatchObject({
      eventId: `evt_${charge.id}`,
      author: 'user-alice',
      text: 'Customer called about this one',
    });
    const retry = await note('"note-1"');
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(((await retry.json()) as { id: number }).id).toBe(created.id);
    const changed = await note('"note-1"', 'Something else');
    expect(changed.status).toBe(422);
    expect(await changed.json()).toMatchObject({ code: 'fingerprint_mismatch' });
    const missing = await note(undefined);
    expect(missing.status).toBe(400);
    expect(await missing.json()).toMatchObject({ code: 'key_missing' });
    const second = await note('"note-2"');
    expect(second.status).toBe(201);
    const shown = await admin(`/webhook-events/evt_${charge.id}`);
    const notes = ((await shown.json()) as { notes: { id: number }[] }).notes;
    expect(notes.map((n) => n.id)).toEqual([created.id, ((await second.json()) as { id: number }).id]);
  });

  it('refuses a note key reused on an event id spelled in another case (422): ids are case-sensitive', async () => {
    // Koa's routing ignores case, so the route's operation is the path folded to lower case: the
    // notes of evt_A and evt_a share one record per key. The fingerprint keeps the path as sent, so
    // the second is refused as a key reused for another request, never answered with evt_A's note.
    const charge = await createCharge(57);
    await stack.api.relayOnce();
    const key = `"${randomUUID()}"`;
    const eventId = `evt_${charge.id}`;
    const swapped = [...eventId].map((c) => (c === c.toLowerCase() ? c.toUpperCase() : c.toLowerCase())).join('');
    const first = await postNote(eventId, { text: 'On the right event' }, { key });
    expect(first.status).toBe(201);
    const other = await postNote(swapped, { text: 'On the right event' }, { key });
    expect(other.status).toBe(422);
    expect(await other.json()).toMatchObject({ code: 'fingerprint_mismatch' });
    expect(await notesOf(eventId)).toHaveLength(1);
  });

  it('keeps note keys per admin and client: the same key from another client adds its own note', async () => {
    const charge = await createCharge(60);
    await stack.api.relayOnce();
    const key = `"${randomUUID()}"`;
    const first = await postNote(`evt_${charge.id}`, { text: 'From the console' }, { key, client: 'cli-pkce' });
    expect(first.status).toBe(201);
    const other = await postNote(`evt_${charge.id}`, { text: 'From the ops tool' }, { key, client: 'ops-tool' });
    expect(other.status).toBe(201);
    expect(other.headers.get('idempotent-replayed')).toBeNull();
    expect(await other.json()).toMatchObject({ text: 'From the ops tool' });
  });

  it('refuses an empty note with 422 and a note on an unknown event with 404', async () => {
    const charge = await createCharge(56);
    await stack.api.relayOnce();
    expect((await postNote(`evt_${charge.id}`, { text: '  ' })).status).toBe(422);
    expect((await postNote('evt_never_seen', { text: 'x' })).status).toBe(404);
    expect((await postNote('%00', { text: 'x' })).status).toBe(404);
  });

  it.each(['a\u0000b', 'bell\u0007', 'escape\u001b[31m'])(
    'refuses a note with a control character (%j) with 422, not a 500',
    async (text) => {
      const charge = await createCharge(58);
      await stack.api.relayOnce();
      const response = await postNote(`evt_${charge.id}`, { text });
      expect(response.status).toBe(422);
      expect(await response.json()).toMatchObject({ code: 'validation_failed' });
    },
  );

  it('checks a note before it claims the key: the corrected retry with the same key adds the note', async () => {
    const charge = await createCharge(57);
    await stack.api.relayOnce();
    const key = `"${randomUUID()}"`;
    const invalid = await postNote(`evt_${charge.id}`, { text: '' }, { key });
    expect(invalid.status).toBe(422);
    expect(await invalid.json()).toMatchObject({ code: 'validation_failed' });
    const corrected = await postNote(`evt_${charge.id}`, { text: 'Customer called' }, { key });
    expect(corrected.status).toBe(201);
    expect(await corrected.json()).toMatchObject({ text: 'Customer called' });
    // The key is now the corrected note's: a retry replays it.
    const retry = await postNote(`evt_${charge.id}`, { text: 'Customer called' }, { key });
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
  });

  it('reads a gzip-compressed note as its text', async () => {
    const charge = await createCharge(61);
    await stack.api.relayOnce();
    const response = await fetch(new URL(`/webhook-events/evt_${charge.id}/notes`, stack.gateway.url), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${await mint(['admin'], 'events:write')}`,
        'content-type': 'application/json',
        'content-encoding': 'gzip',
        'idempotency-key': `"${randomUUID()}"`,
      },
      body: gzipSync(JSON.stringify({ text: 'Compressed on the way' })),
    });
    expect(response.status).toBe(201);
    expect(await response.json()).toMatchObject({ text: 'Compressed on the way' });
  });

  it('keeps a note without the blanks around it', async () => {
    const charge = await createCharge(65);
    await stack.api.relayOnce();
    const response = await postNote(`evt_${charge.id}`, { text: '  \n Checked twice.\t ' });
    expect(response.status).toBe(201);
    expect(await response.json()).toMatchObject({ text: 'Checked twice.' });
  });

  it('takes a note of 500 characters and refuses one of 501 with 422', async () => {
    const charge = await createCharge(64);
    await stack.api.relayOnce();
    expect((await postNote(`evt_${charge.id}`, { text: 'n'.repeat(500) })).status).toBe(201);
    // Counted as stored, trimmed: the blanks around a note of 500 characters do not make it 502.
    const padded = await postNote(`evt_${charge.id}`, { text: ` ${'p'.repeat(500)}\n` });
    expect(padded.status).toBe(201);
    expect(await padded.json()).toMatchObject({ text: 'p'.repeat(500) });
    const long = await postNote(`evt_${charge.id}`, { text: 'n'.repeat(501) });
    expect(long.status).toBe(422);
    expect(await long.json()).toMatchObject({ code: 'validation_failed' });
  });

  it('inflates a compressed note only up to the body limit: a small gzip bomb is 413, not read whole', async () => {
    const charge = await createCharge(66);
    await stack.api.relayOnce();
    // About 100 bytes on the wire, 1 MiB once inflated.
    const bomb = gzipSync(JSON.stringify({ text: ' '.repeat(1024 * 1024) }));
    const response = await fetch(new URL(`/webhook-events/evt_${charge.id}/notes`, stack.gateway.url), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${await mint(['admin'], 'events:write')}`,
        'content-type': 'application/json',
        'content-encoding': 'gzip',
        'idempotency-key': `"${randomUUID()}"`,
      },
      body: bomb,
    });
    expect(response.status).toBe(413);
    expect(await response.json()).toMatchObject({ code: 'body_too_large' });
  });

  it('keeps line breaks and tabs in a note: an operator may write several lines', async () => {
    const charge = await createCharge(59);
    await stack.api.relayOnce();
    const response = await postNote(`evt_${charge.id}`, { text: 'Customer called.\n\tRefund promised.' });
    expect(response.status).toBe(201);
    expect(await response.json()).toMatchObject({ text: 'Customer called.\n\tRefund promised.' });
  });

  it('does not route a path that only starts like the prefix to the receiver', async () => {
    const response = await admin('/webhook-events-x');
    expect(response.status).toBe(404);
    expect(await response.json()).toMatchObject({ code: 'route_not_found' });
  });

  it('keeps a path that only starts like the prefix out of the admin API at the receiver itself', async () => {
    // Straight to the receiver's port: the gateway's routing cannot hide a prefix match that is too wide.
    for (const path of ['/webhook-events-x', '/webhook-eventsx/notes']) {
      const get = await fetch(new URL(path, stack.receiver.url));
      expect(get.status, path).toBe(404);
      expect(await get.json()).toMatchObject({ code: 'route_not_found' });
    }
    const post = await fetch(new URL('/webhook-eventsx/notes', stack.receiver.url), { method: 'POST', body: '{}' });
    expect(post.status).toBe(404);
    expect(await post.json()).toMatchObject({ code: 'route_not_found' });
  });
});
