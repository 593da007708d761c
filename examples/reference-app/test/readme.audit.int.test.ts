// Audit of examples/reference-app/README.md against the app: each claim about behaviour that no other
// test file pinned, checked against the real app (the resource stack on the file's database and Redis
// prefix, the identity provider, `npm start` itself). A check marked "Was wrong" failed when the audit
// wrote it.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestStack, type TestStack } from './test-stack.js';

/** `text` encoded as bytes fetch sends as they are (a string it would send as UTF-8, and as text/plain). */
const bytes = (text: string, encoding: BufferEncoding = 'utf8') => new Uint8Array(Buffer.from(text, encoding));

describe('README "Errors": 415 unsupported_media_type for a body that is not JSON in UTF-8', () => {
  let test: TestStack;
  let eventId: string;

  beforeAll(async () => {
    test = await startTestStack('readme_media');
    // One delivered payment event, for the receiver's notes route.
    const charge = await send('POST', '/charges', JSON.stringify({ amount: 100, currency: 'EUR' }));
    expect(charge.status).toBe(201);
    eventId = `evt_${((await charge.json()) as { id: string }).id}`;
    expect((await test.stack.api.relayOnce()).delivered).toBe(1);
  }, 60_000);

  afterAll(async () => {
    await test?.close();
  });

  async function send(
    method: string,
    path: string,
    body: string | Uint8Array<ArrayBuffer>,
    headers: Record<string, string> = { 'content-type': 'application/json' },
    key = `"${randomUUID()}"`,
  ): Promise<Response> {
    const token = await test.token({ roles: ['admin'] });
    return fetch(new URL(path, test.stack.gateway.url), {
      method,
      headers: { authorization: `Bearer ${token}`, 'idempotency-key': key, ...headers },
      body,
    });
  }

  const routes = () =>
    [
      ['POST', '/charges', { amount: 100, currency: 'EUR' }],
      ['POST', '/photos', { title: 'Harbour' }],
      ['PUT', '/settings', { theme: 'dark' }],
      ['PUT', '/stock/item-1', { level: 3 }],
      ['POST', '/stock/batch', { items: ['item-1'] }],
      ['POST', `/webhook-events/${eventId}/notes`, { text: 'Customer called' }],
    ] as const;

  // Was wrong: body-parser takes any charset that starts with `utf-` (RFC 8259 allowed UTF-16 and
  // UTF-32 once), so `application/json; charset=utf-16` with UTF-16 bytes made a charge (201), saved
  // settings and added a photo; the README says a charset other than UTF-8 is 415, and RFC 8259 has
  // JSON between systems in UTF-8 only. `charset=utf-32` was 400 body_malformed.
  it.each(['utf-16', 'utf-16le', 'UTF-32'])(
    'refuses JSON in charset=%s with 415 on every route that reads a body, before its key is claimed',
    async (charset) => {
      for (const [method, path, json] of routes()) {
        const key = `"${randomUUID()}"`;
        const encoding = charset.toLowerCase().startsWith('utf-16') ? 'utf16le' : 'utf8';
        const refused = await send(
          method,
          path,
          bytes(JSON.stringify(json), encoding),
          { 'content-type': `application/json; charset=${charset}` },
          key,
        );
        expect(refused.status, `${method} ${path}`).toBe(415);
        expect(refused.headers.get('content-type')).toContain('application/problem+json');
        expect(await refused.json()).toMatchObject({ status: 415, code: 'unsupported_media_type' });
        // The key was not used up: the same key with the body in UTF-8 runs.
        const sent = await send(method, path, JSON.stringify(json), { 'content-type': 'application/json' }, key);
        expect(sent.status, `${method} ${path}`).toBeLessThan(300);
      }
    },
  );

  it.each(['application/json; charset=utf-8', 'application/json; charset="UTF-8"', 'application/json'])(
    'takes %s',
    async (contentType) => {
      for (const [method, path, json] of routes()) {
        const sent = await send(method, path, JSON.stringify(json), { 'content-type': contentType });
        expect(sent.status, `${method} ${path}`).toBeLessThan(300);
      }
    },
  );

  // Was wrong: the receiver's notes route read any body as JSON whatever its Content-Type (text/plain,
  // a form, none at all, JSON in latin1), and added the note (201); the README's 415 for a body that
  // is not JSON held for the API's routes only.
  it.each([['text/plain'], ['application/x-www-form-urlencoded'], ['application/json; charset=latin1'], [undefined]])(
    'refuses a note sent as %s (undefined: no Content-Type) with 415, and adds nothing',
    async (contentType) => {
      const path = `/webhook-events/${eventId}/notes`;
      const before = await notesOf(eventId);
      const refused = await send(
        'POST',
        path,
        // Bytes, not a string: fetch would make a string text/plain by itself.
        bytes(JSON.stringify({ text: `sent as ${contentType}` })),
        contentType === undefined ? {} : { 'content-type': contentType },
      );
      expect(refused.status).toBe(415);
      expect(await refused.json()).toMatchObject({ status: 415, code: 'unsupported_media_type' });
      expect(await notesOf(eventId)).toEqual(before);
    },
  );

  async function notesOf(id: string): Promise<unknown[]> {
    const token = await test.token({ roles: ['admin'] });
    const shown = await fetch(new URL(`/webhook-events/${id}`, test.stack.gateway.url), {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(shown.status).toBe(200);
    return ((await shown.json()) as { notes: unknown[] }).notes;
  }
});
