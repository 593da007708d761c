import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { sign } from '@idem/webhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findChargeState } from '../src/receiver/charges.js';
import { findReceivedEvent } from '../src/receiver/events.js';
import { loadWebhookSecret } from '../src/schema/api-schema.js';
import { startTestStack, type TestStack } from './test-stack.js';

// Edges of the receiver's apply a mutation pass found unchecked: the version guard's strictness and
// what an amount that is no safe integer is recorded as. Events are posted signed, straight to the
// receiver's webhook endpoint, as the API's relay posts them.
let test: TestStack;

beforeAll(async () => {
  test = await startTestStack('receiver_edges');
}, 60_000);

afterAll(async () => {
  await test?.close();
});

async function post(id: string, payload: unknown): Promise<number> {
  const secret = await loadWebhookSecret(test.db);
  const body = JSON.stringify(payload);
  const headers = sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret });
  const response = await fetch(test.stack.receiver.webhookUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
  await response.arrayBuffer();
  return response.status;
}

describe('receiver: applying an event', () => {
  // Only a newer version moves a charge: a second event of the version the charge holds (another
  // sender's copy, a replayed export under a new id) is acknowledged and changes nothing.
  it('keeps the state of the first event when another event of the same version arrives', async () => {
    const chargeId = `ch_${randomUUID()}`;
    const first = `evt_a_${randomUUID()}`;
    expect(
      await post(first, { type: 'payment.refunded', data: { id: chargeId, status: 'refunded', version: 2 } }),
    ).toBe(200);
    const second = `evt_b_${randomUUID()}`;
    expect(
      await post(second, { type: 'payment.disputed', data: { id: chargeId, status: 'disputed', version: 2 } }),
    ).toBe(200);
    expect(await findChargeState(test.db, chargeId)).toMatchObject({ status: 'refunded', version: 2, eventId: first });
    expect(await findReceivedEvent(test.db, second)).toMatchObject({ applied: 1 });
  });

  // The amount is shown, not computed with: one that is no safe integer is recorded as unknown (null)
  // and the event still applies, rather than failing the insert and being retried for days.
  it.each([1.5, 2 ** 53])('records an amount of %d as null and applies the event once', async (amount) => {
    const id = `evt_amount_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount, currency: 'EUR' } })).toBe(200);
    expect(await findReceivedEvent(test.db, id)).toMatchObject({ amount: null, currency: 'EUR', applied: 1 });
  });
});

describe('receiver admin API: paths it does not serve', () => {
  // Only `<id>/notes` is the notes route: another segment after the id is no resource at all (404),
  // not the notes route under another name (which would answer a GET with 405, or add a note).
  it.each(['GET', 'POST'])('answers %s /webhook-events/<id>/other with 404, and adds no note', async (method) => {
    const id = `evt_path_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    const token = await test.token({ roles: ['admin'], scope: 'events:read events:write' });
    const response = await fetch(new URL(`/webhook-events/${id}/other`, test.stack.gateway.url), {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'idempotency-key': `"${randomUUID()}"`,
      },
      ...(method === 'POST' ? { body: JSON.stringify({ text: 'not a note' }) } : {}),
    });
    expect(response.status).toBe(404);
    const { rows } = await test.db.query<{ n: number }>(
      'select count(*)::int as n from receiver_event_notes where event_id = $1',
      [id],
    );
    expect(rows[0]?.n).toBe(0);
  });
});

describe('receiver admin API: notes and lists', () => {
  const postNote = async (id: string, body: string | Uint8Array<ArrayBuffer>, headers: Record<string, string> = {}) => {
    const token = await test.token({ roles: ['admin'], scope: 'events:read events:write' });
    const response = await fetch(new URL(`/webhook-events/${id}/notes`, test.stack.gateway.url), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'idempotency-key': `"${randomUUID()}"`,
        ...headers,
      },
      body,
    });
    return { status: response.status, body: await response.json() };
  };

  // `Content-Encoding: identity` is no coding at all: the note is checked as any other, never left
  // unchecked to the handler (which would add an empty note for a body without a text).
  it('checks a note sent with Content-Encoding: identity like any other', async () => {
    const id = `evt_identity_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    const refused = await postNote(id, '{"text":""}', { 'content-encoding': 'identity' });
    expect(refused).toMatchObject({ status: 422, body: { code: 'validation_failed' } });
    const added = await postNote(id, '{"text":"  kept  "}', { 'content-encoding': 'identity' });
    expect(added).toMatchObject({ status: 201, body: { text: 'kept' } });
  });

  // Was wrong: a body that is not JSON at all got 422 validation_failed, where the API (and the HTTP
  // table) answer JSON that does not parse with 400 body_malformed; JSON of another shape stays 422.
  it.each([
    ['{"text":', 400, 'body_malformed'],
    ['not json', 400, 'body_malformed'],
    ['', 422, 'validation_failed'],
    ['null', 422, 'validation_failed'],
    ['["text"]', 422, 'validation_failed'],
  ])('answers a note body %j with %i %s, and adds no note', async (body, status, code) => {
    const id = `evt_shape_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    expect(await postNote(id, body)).toMatchObject({ status, body: { code } });
    const { rows } = await test.db.query<{ n: number }>(
      'select count(*)::int as n from receiver_event_notes where event_id = $1',
      [id],
    );
    expect(rows[0]?.n).toBe(0);
  });

  // Was wrong: validNote left a body it could not decode (a coding it does not take, bytes that do not
  // inflate) to the idempotency middleware, which fingerprints such a body as it came and answers
  // nothing: the handler then added an empty note (201), against the 1-to-500-characters rule. Such a
  // body is now refused before the key is claimed, as the API refuses it: 415 or 400.
  it.each([
    [
      'a coding it does not take',
      'identity, identity',
      new TextEncoder().encode('{"text":""}'),
      415,
      'unsupported_media_type',
    ],
    [
      'a list of codings',
      'gzip, gzip',
      new Uint8Array(gzipSync(gzipSync('{"text":"x"}'))),
      415,
      'unsupported_media_type',
    ],
    ['bytes that do not inflate', 'gzip', new TextEncoder().encode('not gzip'), 400, 'body_malformed'],
    ['bytes that do not decode as br', 'br', new TextEncoder().encode('xx'), 400, 'body_malformed'],
  ])('refuses a note in %s, adds nothing and keeps the key', async (_name, coding, bytes, status, code) => {
    const id = `evt_coding_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    const key = `"${randomUUID()}"`;
    const refused = await postNote(id, bytes, { 'content-encoding': coding, 'idempotency-key': key });
    expect(refused).toMatchObject({ status, body: { status, code } });
    const { rows } = await test.db.query<{ n: number }>(
      'select count(*)::int as n from receiver_event_notes where event_id = $1',
      [id],
    );
    expect(rows[0]?.n).toBe(0);
    const added = await postNote(id, '{"text":"after"}', { 'idempotency-key': key });
    expect(added).toMatchObject({ status: 201, body: { text: 'after' } });
  });

  // A body past the notes' 16 KiB is not read whole by the check: it answers 413 as the idempotency
  // middleware does (an unanswered request would be Koa's bare 404).
  it('answers a note body over 16 KiB with 413 body_too_large', async () => {
    const id = `evt_large_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    const refused = await postNote(id, JSON.stringify({ text: 'x'.repeat(17 * 1024) }));
    expect(refused).toMatchObject({ status: 413, body: { code: 'body_too_large' } });
  });

  // Was wrong: the same body sent chunked (no Content-Length) was added as an empty note (201). The
  // check's read stops past 16 KiB and drains the rest; it left the 413 to the idempotency middleware,
  // whose own read then took the drained body as an empty one, claimed the key and ran the handler
  // without a note, which fell back to ''. The check now answers the 413 itself.
  it('answers a chunked note body over 16 KiB with 413 body_too_large, and adds no note', async () => {
    const id = `evt_chunked_${randomUUID()}`;
    expect(await post(id, { type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 1, currency: 'EUR' } })).toBe(
      200,
    );
    const text = JSON.stringify({ text: 'x'.repeat(17 * 1024) });
    const chunks = [text.slice(0, 9000), text.slice(9000)].map((part) => new TextEncoder().encode(part));
    const token = await test.token({ roles: ['admin'], scope: 'events:read events:write' });
    const response = await fetch(new URL(`/webhook-events/${id}/notes`, test.stack.gateway.url), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'idempotency-key': `"${randomUUID()}"`,
      },
      body: new ReadableStream({
        async pull(controller) {
          const chunk = chunks.shift();
          if (chunk === undefined) controller.close();
          else {
            await new Promise((resolve) => setTimeout(resolve, 20));
            controller.enqueue(chunk);
          }
        },
      }),
      duplex: 'half',
    } as RequestInit);
    const { rows } = await test.db.query<{ n: number }>(
      'select count(*)::int as n from receiver_event_notes where event_id = $1',
      [id],
    );
    expect({ status: response.status, body: await response.json(), notes: rows[0]?.n }).toMatchObject({
      status: 413,
      body: { code: 'body_too_large' },
      notes: 0,
    });
  });

  // The operators' list is the receiver's whole recent history up to 1000 events, not the page's 100.
  it('lists more than 100 events', async () => {
    const prefix = `evt_many_${randomUUID().slice(0, 8)}`;
    await test.db.query(
      `insert into receiver_events (id, type, deliveries, applied)
       select $1 || '_' || n, 'payment.succeeded', 1, 1 from generate_series(1, 101) n`,
      [prefix],
    );
    const token = await test.token({ roles: ['admin'], scope: 'events:read' });
    const response = await fetch(new URL('/webhook-events', test.stack.gateway.url), {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(response.status).toBe(200);
    const { events } = (await response.json()) as { events: Array<{ id: string }> };
    expect(events.filter((event) => event.id.startsWith(prefix))).toHaveLength(101);
  });
});
