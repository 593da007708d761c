import { createReadStream } from 'node:fs';
import { Readable, Stream } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { abortableSleep, type ClientOptions, createClient, isRequestFailedError } from '@idem/client';
import { describe, expect, it, vi } from 'vitest';
import { failure } from './support/failure.js';
import { empty, json, scriptedFetch } from './support/fake-fetch.js';
import { fakeTime } from './support/fake-time.js';
import { scriptedClient } from './support/scripted-client.js';

const uuidV4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

const setup = scriptedClient;

describe('keys: one per logical operation', () => {
  it('gives a POST a fresh UUIDv4 and sends the same key on every attempt', async () => {
    const { client, seen } = setup([empty(503), new TypeError('fetch failed'), json(201, { id: 'ch_1' })]);
    const result = await client.post<{ id: string }>('/charges', { amount: 500 });
    expect(result.status).toBe(201);
    expect(result.body).toEqual({ id: 'ch_1' });
    expect(seen).toHaveLength(3);
    const fields = seen.map((r) => r.headers.get('idempotency-key'));
    expect(new Set(fields).size).toBe(1);
    expect(fields[0]).toBe(`"${result.key}"`);
    expect(result.key).toMatch(uuidV4);
    expect(result.attempts.map((a) => a.key)).toEqual([result.key, result.key, result.key]);
    // The body is encoded once: every attempt carries the same bytes.
    expect(new Set(seen.map((r) => r.body))).toEqual(new Set(['{"amount":500}']));
    expect(seen[0]?.headers.get('content-type')).toBe('application/json');
  });

  it('makes a new key for each logical operation', async () => {
    const { client } = setup([json(201, {})]);
    const a = await client.post('/charges', { amount: 1 });
    const b = await client.post('/charges', { amount: 1 });
    expect(a.key).not.toBe(b.key);
  });

  it('gives PATCH a key and leaves GET, PUT and DELETE without one', async () => {
    const { client, seen } = setup([json(200, {})]);
    await client.patch('/orders/1', { note: 'x' });
    await client.get('/stock', { query: { item: 'sku-1' } });
    await client.put('/settings', { theme: 'dark' });
    await client.delete('/photos/1');
    expect(seen.map((r) => [r.method, r.headers.has('idempotency-key')])).toEqual([
      ['PATCH', true],
      ['GET', false],
      ['PUT', false],
      ['DELETE', false],
    ]);
  });

  it('uses a given key, in sf-string or bare format', async () => {
    const { client, seen } = setup([json(201, {})]);
    const result = await client.post('/charges', {}, { idempotencyKey: 'order-42-charge' });
    expect(result.key).toBe('order-42-charge');
    expect(seen[0]?.headers.get('idempotency-key')).toBe('"order-42-charge"');
    const bare = setup([json(201, {})], { keyFormat: 'bare' });
    await bare.client.post('/charges', {}, { idempotencyKey: 'order-42-charge' });
    expect(bare.seen[0]?.headers.get('idempotency-key')).toBe('order-42-charge');
  });

  it('refuses a key the header cannot carry', async () => {
    const { client, seen } = setup([json(201, {})]);
    await expect(client.post('/charges', {}, { idempotencyKey: '' })).rejects.toThrow(TypeError);
    await expect(client.post('/charges', {}, { idempotencyKey: 'caf\u00e9' })).rejects.toThrow(TypeError);
    const bare = setup([json(201, {})], { keyFormat: 'bare' });
    await expect(bare.client.post('/charges', {}, { idempotencyKey: 'a b' })).rejects.toThrow(TypeError);
    expect(seen).toHaveLength(0);
  });

  it('sends a key set by hand as a header exactly as written', async () => {
    const { client, seen } = setup([empty(503), json(201, {})]);
    const result = await client.post('/charges', {}, { headers: { 'Idempotency-Key': 'k-123' } });
    expect(seen.map((r) => r.headers.get('idempotency-key'))).toEqual(['k-123', 'k-123']);
    expect(result.key).toBe('k-123');
  });

  it('adopts a server-minted key for the later attempts', async () => {
    const { client, seen } = setup([empty(503, { 'Idempotency-Key': 'srv-minted-1' }), json(201, { id: 'ch_9' })]);
    const result = await client.post('/charges', { amount: 5 });
    expect(seen[0]?.headers.get('idempotency-key')).toMatch(/^"[0-9a-f-]{36}"$/);
    expect(seen[1]?.headers.get('idempotency-key')).toBe('srv-minted-1');
    expect(result.key).toBe('srv-minted-1');
    expect(result.attempts[1]?.key).toBe('srv-minted-1');
  });

  it('never replaces a key the caller chose with another echoed one (a proxy rewriting it)', async () => {
    const byOption = setup([empty(503, { 'Idempotency-Key': 'someone-else' }), json(201, {})]);
    const result = await byOption.client.post('/charges', {}, { idempotencyKey: 'order-7' });
    expect(byOption.seen.map((r) => r.headers.get('idempotency-key'))).toEqual(['"order-7"', '"order-7"']);
    expect(result.key).toBe('order-7');
    expect(result.attempts.map((a) => a.key)).toEqual(['order-7', 'order-7']);

    const byHeader = setup([empty(503, { 'Idempotency-Key': 'someone-else' }), json(201, {})]);
    const viaHeader = await byHeader.client.post('/charges', {}, { headers: { 'Idempotency-Key': 'k-123' } });
    expect(byHeader.seen.map((r) => r.headers.get('idempotency-key'))).toEqual(['k-123', 'k-123']);
    expect(viaHeader.key).toBe('k-123');
  });

  it('with idempotencyKey false sends no key, and a minted one makes the retry safe', async () => {
    const unsafe = setup([new TypeError('socket hang up'), json(201, {})]);
    const lost = await failure(unsafe.client.post('/charges', {}, { idempotencyKey: false }));
    expect(lost.code).toBe('network_error');
    expect(unsafe.seen).toHaveLength(1);
    expect(unsafe.seen[0]?.headers.has('idempotency-key')).toBe(false);

    const minted = setup([empty(503, { 'Idempotency-Key': '"m-1"' }), json(201, {})]);
    const result = await minted.client.post('/charges', {}, { idempotencyKey: false });
    expect(minted.seen.map((r) => r.headers.get('idempotency-key'))).toEqual([null, '"m-1"']);
    expect(result.key).toBe('m-1');
  });

  it('refuses an Idempotency-Key among the client-wide headers, in any spelling (it would make every call one)', () => {
    const fetch = scriptedFetch([json(201, {})]).fetch;
    const spellings: HeadersInit[] = [
      { 'Idempotency-Key': 'set-once-at-startup' },
      { 'idempotency-key': 'k' },
      [['IDEMPOTENCY-KEY', 'k']],
      new Headers({ 'Idempotency-key': 'k' }),
    ];
    for (const headers of spellings) {
      expect(() => createClient({ baseUrl: 'https://x.test', fetch, headers })).toThrow(TypeError);
    }
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, headers: { 'Idempotency-Key': 'k' } })).toThrow(
      /idempotencyKey/,
    );
  });

  it('copies a byte body when the call is made: a buffer changed during the backoff is not sent', async () => {
    for (const make of [
      (text: string) => new TextEncoder().encode(text),
      (text: string) => new TextEncoder().encode(text).buffer,
      (text: string) => new DataView(new TextEncoder().encode(`xx${text}`).buffer, 2),
      (text: string) => Buffer.from(text),
    ]) {
      const { client, seen, time } = setup([empty(503), json(201, {})]);
      const body = make('{"amount":500}');
      const view = body instanceof ArrayBuffer ? new Uint8Array(body) : new Uint8Array(body.buffer, body.byteOffset);
      time.onSleep(() => view.set(new TextEncoder().encode('{"amount":900}')));
      await client.post('/charges', body, { headers: { 'content-type': 'application/json' } });
      expect(seen.map((r) => r.body)).toEqual(['{"amount":500}', '{"amount":500}']);
    }
  });

  it('serialises URLSearchParams and FormData when the call is made, so one reused in a loop sends each value', async () => {
    const { client, seen } = setup([json(201, {})]);
    const params = new URLSearchParams();
    const form = new FormData();
    const calls: Promise<unknown>[] = [];
    for (const item of ['sku-1', 'sku-2']) {
      params.set('item', item);
      form.set('item', item);
      calls.push(client.post('/reservations', params), client.post('/uploads', form));
    }
    await Promise.all(calls);
    const sent = (path: string) => seen.filter((r) => r.url.endsWith(path));
    expect(sent('/reservations').map((r) => r.body)).toEqual(['item=sku-1', 'item=sku-2']);
    // Still the type fetch would give a URLSearchParams body.
    expect(sent('/reservations')[0]?.headers.get('content-type')).toBe(
      'application/x-www-form-urlencoded;charset=UTF-8',
    );
    expect(sent('/uploads').map((r) => /\r\n\r\n(sku-\d)\r\n/.exec(r.body ?? '')?.[1])).toEqual(['sku-1', 'sku-2']);
  });

  it('does not adopt an ambiguous minted key (two values)', async () => {
    const { client, seen } = setup([empty(503, { 'Idempotency-Key': 'a, b' }), json(201, {})]);
    const result = await client.post('/charges', {});
    expect(seen[1]?.headers.get('idempotency-key')).toBe(seen[0]?.headers.get('idempotency-key'));
    expect(result.key).not.toBe('a, b');
  });
});

describe('what is retried', () => {
  for (const status of [409, 429, 502, 503, 504, 500]) {
    it(`retries a keyed POST on ${status}`, async () => {
      const { client, seen } = setup([empty(status), json(201, {})]);
      const result = await client.post('/charges', {});
      expect(result.status).toBe(201);
      expect(seen).toHaveLength(2);
    });
  }

  for (const status of [400, 401, 403, 404, 405, 410, 413, 422]) {
    it(`never retries ${status}`, async () => {
      const { client, seen, time } = setup([json(status, { code: 'nope' }), json(201, {})]);
      const error = await failure(client.post('/charges', {}));
      expect(error.code).toBe('http_error');
      expect(error.status).toBe(status);
      expect(error.body).toEqual({ code: 'nope' });
      expect(error.response?.status).toBe(status);
      expect(error.retried).toBe(false);
      expect(seen).toHaveLength(1);
      expect(time.waits).toEqual([]);
    });
  }

  it('retries 408 and 425 when a repeat is safe (a key, or an idempotent method), not for an unkeyed POST', async () => {
    for (const status of [408, 425]) {
      const keyed = setup([empty(status, { connection: 'close' }), json(201, { id: 'ch_1' })]);
      expect((await keyed.client.post('/charges', { amount: 1 })).status).toBe(201);
      expect(keyed.seen).toHaveLength(2);
      expect(keyed.seen[1]?.headers.get('idempotency-key')).toBe(keyed.seen[0]?.headers.get('idempotency-key'));

      const get = setup([empty(status), json(200, {})]);
      expect((await get.client.get('/stock')).status).toBe(200);
      expect(get.seen).toHaveLength(2);

      // Some servers answer 408 for a handler of their own that timed out, after it started.
      const unkeyed = setup([empty(status), json(201, {})]);
      const error = await failure(unkeyed.client.post('/charges', {}, { idempotencyKey: false }));
      expect([error.code, error.status]).toEqual(['http_error', status]);
      expect(unkeyed.seen).toHaveLength(1);
    }
  });

  it('refuses a GET or HEAD with a body as misuse, before any attempt (fetch would refuse every one)', async () => {
    const { client, seen, time } = setup([json(200, {})]);
    for (const method of ['GET', 'get', 'HEAD']) {
      await expect(client.request(method, '/stock', { body: { item: 'sku-1' } })).rejects.toThrow(TypeError);
    }
    expect(seen).toHaveLength(0);
    expect(time.waits).toEqual([]);
    // Without a body they go out as usual.
    await client.request('GET', '/stock');
    expect(seen).toHaveLength(1);
  });

  it('sends a method as fetch does: the standard names and PATCH upper-cased, any other name as written', async () => {
    // Methods are case-sensitive (RFC 9110 9.1): a server may route `purge` and `PURGE` apart, and
    // fetch itself upper-cases only DELETE, GET, HEAD, OPTIONS, POST and PUT. PATCH is upper-cased too:
    // `request('patch', ...)` working is what a caller means, and no server has a lower-case patch.
    const { client, seen } = setup(Array.from({ length: 5 }, () => json(200, {})));
    for (const method of ['post', 'Patch', 'put', 'purge', 'MKCOL']) await client.request(method, '/x');
    expect(seen.map((request) => request.method)).toEqual(['POST', 'PATCH', 'PUT', 'purge', 'MKCOL']);
    // A custom method is a write unless known otherwise: it carries a key.
    expect(seen[3]?.headers.has('idempotency-key')).toBe(true);
  });

  it('retries GET, PUT and DELETE on network errors, timeouts and 500', async () => {
    for (const method of ['get', 'put', 'delete'] as const) {
      const { client, seen } = setup([new TypeError('fetch failed'), empty(500), json(200, { ok: true })]);
      const result = await client[method]('/settings');
      expect(result.body).toEqual({ ok: true });
      expect(seen).toHaveLength(3);
    }
  });

  it('never repeats an unkeyed POST whose outcome is unknown (500, 502, 503, 504), but does on 429', async () => {
    for (const status of [500, 502, 503, 504]) {
      const { client, seen } = setup([empty(status), json(201, {})]);
      const error = await failure(client.post('/charges', {}, { idempotencyKey: false }));
      expect(error.code).toBe('http_error');
      expect(seen).toHaveLength(1);
    }
    const { client, seen } = setup([empty(429), json(201, {})]);
    await client.post('/charges', {}, { idempotencyKey: false });
    expect(seen).toHaveLength(2);
  });

  it('does not retry 409 without a key (a real conflict, not "in progress")', async () => {
    const { client, seen } = setup([json(409, { code: 'version_conflict' }), json(200, {})]);
    const error = await failure(client.put('/settings', { theme: 'dark' }));
    expect(error.code).toBe('http_error');
    expect(seen).toHaveLength(1);
  });

  it('takes a problem that says retryable: false as final, whatever its status (a business 409 on a keyed POST)', async () => {
    const problem = { 'content-type': 'application/problem+json' };
    for (const status of [409, 503, 429]) {
      const { client, seen } = setup([json(status, { code: 'seat_taken', retryable: false }, problem), json(201, {})]);
      const error = await failure(client.post('/bookings', {}));
      expect(error.code, String(status)).toBe('http_error');
      expect(seen, String(status)).toHaveLength(1);
    }
    // Read for the decision whatever the caller's parse mode keeps of the body.
    for (const parse of ['json', 'text', 'bytes'] as const) {
      const raw = setup([json(409, { retryable: false }, problem), json(201, {})]);
      expect((await failure(raw.client.post('/bookings', {}, { parse }))).code, parse).toBe('http_error');
      expect(raw.seen, parse).toHaveLength(1);
    }
  });

  it('keeps the status rule for retryable: true, for other media types, and for bodies that do not parse', async () => {
    const problem = { 'content-type': 'application/problem+json' };
    for (const first of [
      json(409, { code: 'in_progress', retryable: true }, problem),
      json(409, { code: 'seat_taken', retryable: false }), // plain JSON: a field of the business body
      new Response('{not json', { status: 409, headers: problem }),
    ]) {
      const { client, seen } = setup([first, json(201, {})]);
      expect((await client.post('/bookings', {})).status).toBe(201);
      expect(seen).toHaveLength(2);
    }
    // It never makes a final status retryable.
    const { client, seen } = setup([json(422, { retryable: true }, problem), json(201, {})]);
    expect((await failure(client.post('/bookings', {}))).code).toBe('http_error');
    expect(seen).toHaveLength(1);
  });

  it("retries idem's 400 body_incomplete (the body arrived cut short, nothing ran) where a repeat is safe", async () => {
    const problem = { 'content-type': 'application/problem+json' };
    const cut = () =>
      json(400, { code: 'body_incomplete', retryable: true, status: 400, title: 'Request body incomplete' }, problem);
    const keyed = setup([cut(), json(201, { id: 'ch_1' })]);
    const result = await keyed.client.post('/charges', { amount: 5 });
    expect(result.status).toBe(201);
    expect(keyed.seen).toHaveLength(2);
    expect(new Set(keyed.seen.map((r) => r.headers.get('idempotency-key'))).size).toBe(1);
    const put = setup([cut(), json(200, {})]);
    expect((await put.client.put('/settings', { theme: 'dark' })).status).toBe(200);
    expect(put.seen).toHaveLength(2);
    // Without a key a POST is not repeated on a server's word alone.
    const unkeyed = setup([cut(), json(201, {})]);
    expect((await failure(unkeyed.client.post('/charges', {}, { idempotencyKey: false }))).code).toBe('http_error');
    expect(unkeyed.seen).toHaveLength(1);
    // The code alone, in plain JSON, in another status, or with retryable: false, says nothing.
    for (const first of [
      json(400, { code: 'body_incomplete', retryable: true }),
      json(422, { code: 'body_incomplete', retryable: true }, problem),
      json(400, { code: 'body_incomplete', retryable: false }, problem),
      json(400, { code: 'bad_amount', retryable: true }, problem),
    ]) {
      const other = setup([first, json(201, {})]);
      expect((await failure(other.client.post('/charges', {}))).code).toBe('http_error');
      expect(other.seen).toHaveLength(1);
    }
  });

  it('reads retryable: false only from a problem document: no member, no media type or another type says nothing', async () => {
    for (const first of [
      // A problem without the member leaves the status rule: a 503 on a keyed POST is retried.
      json(503, { type: 'about:blank', title: 'Service Unavailable' }, { 'content-type': 'application/problem+json' }),
      // No Content-Type at all: not a problem document, whatever the body says.
      new Response(new TextEncoder().encode('{"retryable":false}'), { status: 409 }),
      // The problem type named only inside a parameter of another type.
      json(409, { retryable: false }, { 'content-type': 'application/json; profile="application/problem+json"' }),
    ]) {
      const { client, seen } = setup([first, json(201, {})]);
      expect((await client.post('/bookings', {})).status).toBe(201);
      expect(seen).toHaveLength(2);
    }
  });

  it('does not retry a replayed outcome: asking again returns the same stored response', async () => {
    const { client, seen } = setup([json(500, { code: 'boom' }, { 'Idempotent-Replayed': 'true' }), json(201, {})]);
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('http_error');
    expect(error.replayed).toBe(true);
    expect(seen).toHaveLength(1);
  });

  it('retries a body that breaks off half way like a network error', async () => {
    const broken = () =>
      new Response(
        new ReadableStream({
          start(controller) {
            controller.enqueue(new TextEncoder().encode('{"id":'));
            controller.error(new TypeError('terminated'));
          },
        }),
        { status: 201, headers: { 'content-type': 'application/json' } },
      );
    const { client, seen } = setup([broken, json(201, { id: 'ch_1' }, { 'Idempotent-Replayed': 'true' })]);
    const result = await client.post('/charges', { amount: 1 });
    expect(result.attempts.map((a) => a.outcome)).toEqual(['network-error', 'response']);
    expect(result.replayed).toBe(true);
    expect(seen[1]?.headers.get('idempotency-key')).toBe(seen[0]?.headers.get('idempotency-key'));
  });

  it('times an attempt out and retries it with the same key', async () => {
    const hang = (_request: unknown, signal: AbortSignal) =>
      new Promise<Response>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
    const { client, seen } = setup([hang, json(201, {})], { retry: { timeout: 20 } });
    const result = await client.post('/charges', {});
    expect(result.attempts.map((a) => a.outcome)).toEqual(['timeout', 'response']);
    expect((result.attempts[0]?.error as Error | undefined)?.name).toBe('TimeoutError');
    expect(seen[1]?.headers.get('idempotency-key')).toBe(seen[0]?.headers.get('idempotency-key'));
  });

  it('times out even a fetch that ignores its signal', async () => {
    const never = () => new Promise<Response>(() => undefined);
    const { client } = setup([never], { retry: { timeout: 15, maxAttempts: 2 } });
    const error = await failure(client.get('/stock'));
    expect(error.code).toBe('attempts_exhausted');
    expect(error.attempts.map((a) => a.outcome)).toEqual(['timeout', 'timeout']);
  });

  it('reports an unkeyed POST timeout as timeout, not retried', async () => {
    const never = () => new Promise<Response>(() => undefined);
    const { client, seen } = setup([never], { retry: { timeout: 15 } });
    const error = await failure(client.post('/charges', {}, { idempotencyKey: false }));
    expect(error.code).toBe('timeout');
    expect(seen).toHaveLength(1);
  });
});

describe('waits, limits and deadlines', () => {
  it('honours Retry-After in seconds as a floor over the backoff', async () => {
    // Without jitter: the wait is exactly the floor (the spread past it is pinned in backoff.test.ts).
    const { client, time } = setup([empty(503, { 'Retry-After': '3' }), json(201, {})], { retry: { jitter: 'none' } });
    const result = await client.post('/charges', {});
    expect(time.waits).toEqual([3000]);
    expect(result.attempts[0]?.retryAfterMs).toBe(3000);
    expect(result.attempts[0]?.waitMs).toBe(3000);
  });

  it.each([
    ['against the injected clock', Date.UTC(2026, 9, 21, 7, 27, 55), {}, 5_000],
    // The local clock is 10 minutes behind the server's: the server's own Date is the reference.
    [
      "from the response's Date when the local clock is off",
      Date.UTC(2026, 9, 21, 7, 18, 0),
      { Date: 'Wed, 21 Oct 2026 07:27:56 GMT' },
      4_000,
    ],
  ])('honours Retry-After as an HTTP-date %s', async (_label, start, dated, wait) => {
    const time = fakeTime(start);
    const { fetch } = scriptedFetch([
      empty(429, { ...dated, 'Retry-After': 'Wed, 21 Oct 2026 07:28:00 GMT' }),
      json(200, {}),
    ]);
    const client = createClient({
      baseUrl: 'https://api.example.test',
      fetch,
      sleep: time.sleep,
      now: time.now,
      random: () => 0,
    });
    await client.get('/stock');
    expect(time.waits).toEqual([wait]);
  });

  it('gives up with retry_after_too_long instead of retrying early', async () => {
    const { client, seen } = setup([empty(503, { 'Retry-After': '120' })], {
      retry: { maxRetryAfter: '60s', deadline: false },
    });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('retry_after_too_long');
    expect(error.status).toBe(503);
    expect(seen).toHaveLength(1);
  });

  it('honours a Retry-After of exactly maxRetryAfter: only a longer one gives up', async () => {
    const { client, seen, time } = setup([empty(503, { 'Retry-After': '60' }), json(201, {})], {
      retry: { maxRetryAfter: '60s', deadline: false, jitter: 'none' },
    });
    expect((await client.post('/charges', {})).status).toBe(201);
    expect(seen).toHaveLength(2);
    expect(time.waits).toEqual([60_000]);
  });

  it('waits the backoff when it is longer than Retry-After: the header is a floor, not the wait', async () => {
    const { client, time } = setup([empty(503, { 'Retry-After': '1' }), json(201, {})], {
      retry: { baseDelay: '4s', jitter: 'none' },
    });
    const result = await client.post('/charges', {});
    expect(time.waits).toEqual([4000]);
    expect(result.attempts[0]?.retryAfterMs).toBe(1000);
    expect(result.attempts[0]?.waitMs).toBe(4000);
  });

  it('does not wait out a backoff that would end at the deadline itself', async () => {
    const { client, seen, time } = setup([empty(503)], {
      retry: { baseDelay: '5s', jitter: 'none', deadline: '5s', maxAttempts: 10 },
    });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('deadline_exceeded');
    expect(seen).toHaveLength(1);
    expect(time.waits).toEqual([]);
    expect(error.attempts[0]?.waitMs).toBeUndefined();
  });

  it('never starts an attempt once the deadline has passed, even when getToken used up the time', async () => {
    let calls = 0;
    const { client, seen, time } = setup([empty(503), json(201, {})], {
      retry: { deadline: '5s' },
      // The second refresh resolves, but only once the whole deadline is spent.
      getToken: () => {
        calls++;
        if (calls === 2) time.advance(5000);
        return 'token';
      },
    });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('deadline_exceeded');
    expect(seen).toHaveLength(1);
  });

  it('stops after maxAttempts with the last response', async () => {
    const { client, seen, time } = setup([json(503, { title: 'down' })], { retry: { maxAttempts: 4 } });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('attempts_exhausted');
    expect(error.status).toBe(503);
    expect(error.body).toEqual({ title: 'down' });
    expect(error.key).toMatch(uuidV4);
    expect(error.attempts).toHaveLength(4);
    expect(seen).toHaveLength(4);
    expect(time.waits).toHaveLength(3);
    expect(error.attempts[3]?.waitMs).toBeUndefined();
  });

  it('stops when the next wait would end past the deadline', async () => {
    const { client, seen, time } = setup([empty(503, { 'Retry-After': '2' })], {
      retry: { deadline: '5s', maxAttempts: 100 },
    });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('deadline_exceeded');
    expect(error.status).toBe(503);
    // 0 s: first attempt; waits of at least 2 s each; a third wait would pass 5 s.
    expect(seen).toHaveLength(3);
    expect(time.waits.reduce((a, b) => a + b, 0)).toBeLessThan(5000);
  });

  it('cuts the last attempt at the deadline and reports deadline_exceeded', async () => {
    const hang = (_request: unknown, signal: AbortSignal) =>
      new Promise<Response>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
    const { client } = setup([hang], { retry: { deadline: 25, timeout: '10s' } });
    const error = await failure(client.get('/stock'));
    expect(error.code).toBe('deadline_exceeded');
    expect(error.attempts[0]?.outcome).toBe('timeout');
  });

  it('cuts the attempt itself at the deadline, not only its error: a 10 s timeout ends with a 25 ms deadline', async () => {
    let abortedAfter: number | undefined;
    const started = performance.now();
    const hang = (_request: unknown, signal: AbortSignal) =>
      new Promise<Response>((_, reject) =>
        signal.addEventListener('abort', () => {
          abortedAfter = performance.now() - started;
          reject(signal.reason);
        }),
      );
    const { client } = setup([hang], { retry: { deadline: 25, timeout: '10s' } });
    expect((await failure(client.get('/stock'))).code).toBe('deadline_exceeded');
    expect(abortedAfter).toBeLessThan(5_000);
  });

  it('holds a timeout longer than one timer (2^31 - 1 ms) instead of firing at once', async () => {
    const slow = () => new Promise<Response>((resolve) => setTimeout(() => resolve(json(200, { ok: true })), 20));
    const { client } = setup([slow], { retry: { timeout: '30d', deadline: false } });
    const result = await client.get('/stock');
    expect(result.status).toBe(200);
    expect(result.attempts.map((a) => a.outcome)).toEqual(['response']);
  });

  it('retries with no limit but maxAttempts when deadline and timeout are false', async () => {
    const { client, seen } = setup([empty(503), empty(503), json(200, {})], {
      retry: { deadline: false, timeout: false, maxAttempts: 3 },
    });
    await client.get('/stock');
    expect(seen).toHaveLength(3);
  });

  it('uses a per-request retry override on top of the client defaults', async () => {
    const { client, seen } = setup([empty(503)], { retry: { maxAttempts: 5 } });
    const error = await failure(client.get('/stock', { retry: { maxAttempts: 2 } }));
    expect(error.attempts).toHaveLength(2);
    expect(seen).toHaveLength(2);
  });
});

describe('abort', () => {
  it('rejects at once when the signal is already aborted, without a request', async () => {
    const { client, seen } = setup([json(200, {})]);
    const error = await failure(client.get('/stock', { signal: AbortSignal.abort(new Error('user left')) }));
    expect(error.code).toBe('aborted');
    expect((error.cause as Error).message).toBe('user left');
    expect(seen).toHaveLength(0);
  });

  it('aborts during the backoff wait', async () => {
    const controller = new AbortController();
    const { client, seen, time } = setup([empty(503), json(201, {})]);
    time.onSleep(() => controller.abort(new Error('cancelled')));
    const error = await failure(client.post('/charges', {}, { signal: controller.signal }));
    expect(error.code).toBe('aborted');
    expect(error.status).toBe(503);
    expect(seen).toHaveLength(1);
  });

  it('aborts an attempt in flight', async () => {
    const controller = new AbortController();
    const hang = (_request: unknown, signal: AbortSignal) => {
      queueMicrotask(() => controller.abort(new Error('cancelled')));
      return new Promise<Response>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
    };
    const { client } = setup([hang]);
    const error = await failure(client.post('/charges', {}, { signal: controller.signal }));
    expect(error.code).toBe('aborted');
    expect(error.attempts).toHaveLength(1);
  });

  it('aborts a getToken that is still pending, on the first attempt or a retry', async () => {
    for (const hangOn of [1, 2]) {
      const controller = new AbortController();
      let calls = 0;
      const { client, seen } = setup([empty(503), json(201, {})], {
        // An identity provider that never answers.
        getToken: () => (++calls === hangOn ? new Promise<string>(() => undefined) : 't1'),
      });
      const pending = failure(client.post('/charges', {}, { signal: controller.signal }));
      while (calls < hangOn) await new Promise((resolve) => setImmediate(resolve));
      controller.abort(new Error('user left the page'));
      const error = await pending;
      expect(error.code).toBe('aborted');
      expect((error.cause as Error).message).toBe('user left the page');
      expect(seen).toHaveLength(hangOn - 1);
    }
  });

  it('ends a getToken still pending at the deadline with deadline_exceeded', async () => {
    let calls = 0;
    const { client, seen } = setup([empty(503), json(201, {})], {
      retry: { deadline: 40 },
      getToken: () => (++calls === 1 ? 't1' : new Promise<string>(() => undefined)),
      // The wait after the first attempt: shorter than the deadline, on the fake clock.
      random: () => 0,
    });
    const error = await failure(client.post('/charges', {}));
    expect(error.code).toBe('deadline_exceeded');
    expect(error.status).toBe(503);
    expect(seen).toHaveLength(1);
  });

  it('the default sleep really waits and rejects on abort', async () => {
    const { fetch } = scriptedFetch([empty(503), json(200, { ok: 1 })]);
    const client = createClient({ baseUrl: 'http://x.test', fetch, retry: { baseDelay: 5, jitter: 'none' } });
    const result = await client.get('/a');
    expect(result.attempts[0]?.waitMs).toBe(5);
    const controller = new AbortController();
    const slow = createClient({
      baseUrl: 'http://x.test',
      fetch: scriptedFetch([empty(503)]).fetch,
      retry: { baseDelay: '1m', maxDelay: '1m', jitter: 'none', deadline: false },
    });
    const pending = failure(slow.get('/a', { signal: controller.signal }));
    setTimeout(() => controller.abort(new Error('stop')), 5);
    expect((await pending).code).toBe('aborted');
  });

  it('the default sleep waits in full beyond what one timer holds (2^31 - 1 ms, about 24.9 days)', async () => {
    vi.useFakeTimers();
    try {
      const day = 86_400_000;
      let done = false;
      const sleeping = abortableSleep(30 * day).then(() => {
        done = true;
      });
      // One timer would fire after 1 ms for this delay (Node clamps overlong delays to 1).
      await vi.advanceTimersByTimeAsync(29 * day);
      expect(done).toBe(false);
      await vi.advanceTimersByTimeAsync(day);
      await sleeping;
      expect(done).toBe(true);
      const controller = new AbortController();
      const aborted = abortableSleep(40 * day, controller.signal);
      await vi.advanceTimersByTimeAsync(26 * day);
      controller.abort(new Error('stop'));
      await expect(aborted).rejects.toThrow('stop');
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('tokens, results and bodies', () => {
  it('calls getToken before every attempt, so a refreshed token is used on the retry', async () => {
    const tokens = ['t1', 't2', 't3'];
    let calls = 0;
    const { client, seen } = setup([empty(503), empty(503), json(200, {})], {
      getToken: async () => tokens[calls++],
    });
    await client.get('/photos');
    expect(seen.map((r) => r.headers.get('authorization'))).toEqual(['Bearer t1', 'Bearer t2', 'Bearer t3']);
  });

  it('sends no Authorization for an empty, null or undefined token', async () => {
    const tokens = ['', null, undefined, 't4'];
    let calls = 0;
    const { client, seen } = setup([empty(503), empty(503), empty(503), json(200, {})], {
      getToken: () => tokens[calls++],
    });
    await client.get('/photos');
    expect(seen.map((r) => r.headers.get('authorization'))).toEqual([null, null, null, 'Bearer t4']);
  });

  it('tells onRetry the key the next attempt carries: a key the server just minted', async () => {
    const keys: Array<string | undefined> = [];
    const { client, seen } = setup([empty(503, { 'Idempotency-Key': '"minted-1"' }), json(201, {})], {
      onRetry: ({ key }) => void keys.push(key),
    });
    await client.post('/charges', {}, { idempotencyKey: false });
    expect(keys).toEqual(['minted-1']);
    expect(seen[1]?.headers.get('idempotency-key')).toBe('"minted-1"');
  });

  it('tells onRetry about each retry, and ignores what it throws', async () => {
    const events: Array<[number | undefined, number, string | undefined]> = [];
    const { client } = setup([empty(503, { 'Retry-After': '2' }), empty(429), json(201, {})], {
      retry: { jitter: 'none' },
      onRetry: ({ attempt, waitMs, key }) => {
        events.push([attempt.status, waitMs, key]);
        throw new Error('observer bug');
      },
    });
    const result = await client.post('/charges', {});
    expect(events).toHaveLength(2);
    expect(events[0]).toEqual([503, 2000, result.key]);
    expect(events[1]?.[0]).toBe(429);
    expect(result.status).toBe(201);
  });

  it('handles what an async onRetry rejects with (unhandled, it would end the process)', async () => {
    // A pending promise that records whether anybody attached a handler: a rejecting one would
    // fail this file with an unhandled rejection instead of failing this test.
    const returned = new Promise<void>(() => undefined);
    const handlers = vi.spyOn(returned, 'then');
    const { client } = setup([empty(503), json(201, {})], { onRetry: () => returned });
    expect((await client.post('/charges', {})).status).toBe(201);
    expect(handlers).toHaveBeenCalled();
  });

  it('wraps an error thrown by getToken as token_failed, its cause, with the key (an earlier attempt may have run)', async () => {
    const boom = new Error('refresh failed');
    const { client } = setup([json(200, {})], { getToken: () => Promise.reject(boom) });
    const error = await client.post('/charges', {}, { idempotencyKey: 'k-1' }).catch((caught: unknown) => caught);
    expect(isRequestFailedError(error)).toBe(true);
    expect(error).toMatchObject({ code: 'token_failed', cause: boom, key: 'k-1', attempts: [] });
  });

  it('exposes replayed, status, headers and history', async () => {
    const { client } = setup([
      empty(409, { 'Retry-After': '1' }),
      json(201, { id: 'ch_1' }, { 'Idempotent-Replayed': 'true', Location: '/charges/ch_1' }),
    ]);
    const result = await client.post<{ id: string }>('/charges', { amount: 1 });
    expect(result.replayed).toBe(true);
    expect(result.status).toBe(201);
    expect(result.headers.get('location')).toBe('/charges/ch_1');
    expect(result.attempts.map((a) => [a.number, a.status, a.replayed])).toEqual([
      [1, 409, false],
      [2, 201, true],
    ]);
    expect(Object.isFrozen(result.attempts)).toBe(true);
  });

  it('parses bodies per mode', async () => {
    const { client } = setup([
      new Response('plain', { headers: { 'content-type': 'text/plain' } }),
      new Response(new Uint8Array([1, 2, 3]), { headers: { 'content-type': 'application/octet-stream' } }),
      empty(204),
      new Response('{"a":1}', { headers: { 'content-type': 'application/problem+json' } }),
    ]);
    expect((await client.get('/a')).body).toBe('plain');
    expect((await client.get('/b')).body).toEqual(new Uint8Array([1, 2, 3]));
    expect((await client.get('/c')).body).toBeUndefined();
    expect((await client.get('/d')).body).toEqual({ a: 1 });
  });

  it('leaves the body unread with parse: none', async () => {
    const { client } = setup([new Response('raw', { headers: { 'content-type': 'text/plain' } })]);
    const result = await client.get('/a', { parse: 'none' });
    expect(result.body).toBeUndefined();
    expect(await result.response.text()).toBe('raw');
  });

  it('with parse: none, a failure leaves the body unread in response too, and body is undefined', async () => {
    const { client } = setup([
      new Response('{"code":"nope"}', { status: 404, headers: { 'content-type': 'text/plain' } }),
    ]);
    const error = await failure(client.get('/a', { parse: 'none' }));
    expect(error.code).toBe('http_error');
    expect(error.body).toBeUndefined();
    expect(error.response?.bodyUsed).toBe(false);
    expect(await error.response?.text()).toBe('{"code":"nope"}');
  });

  it('rejects a success that claims JSON and is not, and keeps an error page as text', async () => {
    const bad = setup([new Response('<html>', { status: 200, headers: { 'content-type': 'application/json' } })]);
    expect((await failure(bad.client.get('/a'))).code).toBe('invalid_response_body');
    const page = setup([new Response('<html>', { status: 404, headers: { 'content-type': 'application/json' } })]);
    const error = await failure(page.client.get('/a'));
    expect(error.code).toBe('http_error');
    expect(error.body).toBe('<html>');
  });

  it('sends strings, bytes and form bodies as they are, and refuses streams', async () => {
    const { client, seen } = setup([json(200, {})]);
    await client.put('/a', 'text body');
    await client.put('/b', new URLSearchParams({ q: '1' }));
    expect(seen[0]?.body).toBe('text body');
    // The type the Fetch standard gives a string, set by the client: Bun's fetch sets none
    // (runtimes.audit.test.ts).
    expect(seen[0]?.headers.get('content-type')).toBe('text/plain;charset=UTF-8');
    expect(seen[1]?.body).toBe('q=1');
    await expect(client.post('/c', new ReadableStream())).rejects.toThrow(/cannot be retried/);
  });

  it('sends a FormData body as the same bytes, boundary included, on every attempt', async () => {
    const { client, seen } = setup([empty(503), json(201, {})]);
    const form = new FormData();
    form.set('title', 'receipt');
    form.set('amount', '500');
    await client.post('/uploads', form);
    expect(seen).toHaveLength(2);
    const type = seen[0]?.headers.get('content-type');
    expect(type).toMatch(/^multipart\/form-data; boundary=/);
    // fetch would draw a new boundary per attempt, and a server comparing fingerprints would refuse
    // the retry as a different request (422).
    expect(seen[1]?.headers.get('content-type')).toBe(type);
    expect(seen[1]?.body).toBe(seen[0]?.body);
    expect(seen[0]?.body).toContain('name="amount"\r\n\r\n500');
  });

  it('refuses Node streams and async iterables, which JSON would send as their internals', async () => {
    const { client, seen } = setup([json(201, {})]);
    async function* chunks() {
      yield new TextEncoder().encode('a');
    }
    await expect(client.post('/uploads', Readable.from(['a', 'b']))).rejects.toThrow(/cannot be retried/);
    await expect(client.post('/uploads', createReadStream(fileURLToPath(import.meta.url)))).rejects.toThrow(
      /cannot be retried/,
    );
    await expect(client.post('/uploads', chunks())).rejects.toThrow(/cannot be retried/);
    expect(seen).toHaveLength(0);
  });

  it('refuses a legacy Node stream too: it has pipe() but no async iterator', async () => {
    const { client, seen } = setup([json(201, {})]);
    await expect(client.post('/uploads', new Stream())).rejects.toThrow(/cannot be retried/);
    expect(seen).toHaveLength(0);
  });

  it("keeps the caller's own Content-Type for a JSON-encoded body", async () => {
    const { client, seen } = setup([json(200, {})]);
    await client.patch('/orders/1', { note: 'x' }, { headers: { 'Content-Type': 'application/merge-patch+json' } });
    expect(seen[0]?.headers.get('content-type')).toBe('application/merge-patch+json');
    expect(seen[0]?.body).toBe('{"note":"x"}');
  });
});

describe('URLs and options', () => {
  it('joins paths under the base path and appends the query', async () => {
    const { client, seen } = setup([json(200, {})]);
    await client.get('/stock', { query: { item: 'sku 1', tag: ['a', 'b'], skip: undefined } });
    await client.get('stock/batch?x=1');
    expect(seen.map((r) => r.url)).toEqual([
      'https://api.example.test/v1/stock?item=sku+1&tag=a&tag=b',
      'https://api.example.test/v1/stock/batch?x=1',
    ]);
    expect(client.baseUrl).toBe('https://api.example.test/v1');
  });

  it('refuses absolute URLs, so the bearer token never leaves the base origin', async () => {
    const { client, seen } = setup([json(200, {})], { getToken: () => 'secret' });
    await expect(client.get('https://evil.test/steal')).rejects.toThrow(TypeError);
    await expect(client.get('//evil.test/steal')).rejects.toThrow(TypeError);
    expect(seen).toHaveLength(0);
  });

  it('throws a TypeError for bad options at construction', () => {
    const fetch = scriptedFetch([]).fetch;
    expect(() => createClient({ baseUrl: 'not a url', fetch })).toThrow(TypeError);
    expect(() => createClient({ baseUrl: 'ftp://x.test', fetch })).toThrow(TypeError);
    expect(() => createClient({ baseUrl: 'https://x.test/?a=1', fetch })).toThrow(TypeError);
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { maxAttempts: 0 } })).toThrow(/maxAttempts/);
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { baseDelay: -1 } })).toThrow(/baseDelay/);
    // Zero waits would retry in a tight loop; a cap under the base would replace the schedule.
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { baseDelay: 0 } })).toThrow(/baseDelay/);
    expect(() =>
      createClient({ baseUrl: 'https://x.test', fetch, retry: { baseDelay: '2s', maxDelay: '1s' } }),
    ).toThrow(/maxDelay/);
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { maxDelay: 0 } })).toThrow(TypeError);
    expect(
      createClient({ baseUrl: 'https://x.test', fetch, retry: { baseDelay: '2s', maxDelay: '2s' } }),
    ).toBeDefined();
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { timeout: 0 } })).toThrow(/timeout/);
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { deadline: '5 minutes' as never } })).toThrow(
      /deadline/,
    );
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, retry: { jitter: 'some' as never } })).toThrow(
      /jitter/,
    );
    expect(() => createClient({ baseUrl: 'https://x.test', fetch, keyFormat: 'json' as never })).toThrow(/keyFormat/);
  });

  it('computes the retry horizon from the options', () => {
    const fetch = scriptedFetch([]).fetch;
    const client = createClient({ baseUrl: 'https://x.test', fetch });
    expect(client.retryHorizon()).toBe(60_000);
    expect(client.retryHorizon({ maxAttempts: 1 })).toBe(0);
    expect(client.retryHorizon({ maxAttempts: 3, timeout: '5s', deadline: false, maxRetryAfter: '2s' })).toBe(
      // Each wait: up to the 2 s Retry-After and its spread (a fifth of it, 400 ms).
      14_800,
    );
    expect(client.retryHorizon({ maxAttempts: 4, timeout: '1s', deadline: false, maxRetryAfter: 0 })).toBe(
      3_000 + 1_000 + 2_000 + 4_000,
    );
    expect(client.retryHorizon({ timeout: false, deadline: false })).toBe(Number.POSITIVE_INFINITY);
    expect(client.retryHorizon({ deadline: '2h', timeout: false })).toBe(7_200_000);
  });
});

describe('maxResponseBytes', () => {
  it('ends with response_too_large past the limit, not retried, the status kept', async () => {
    const { client, seen } = setup([json(200, { data: 'x'.repeat(100) })], { maxResponseBytes: 64 });
    const error = await failure(client.get('/report'));
    expect([error.code, error.status, error.attempts.length, seen.length]).toEqual(['response_too_large', 200, 1, 1]);
    expect(error.attempts[0]?.outcome).toBe('response');
  });

  it('refuses a declared Content-Length past the limit before reading, and a request can raise the limit', async () => {
    const big = () => new Response('y'.repeat(1000), { status: 200, headers: { 'content-length': '1000' } });
    const { client } = setup([big()], { maxResponseBytes: 999 });
    expect((await failure(client.get('/a'))).code).toBe('response_too_large');
    const result = await client.get('/a', { parse: 'text', maxResponseBytes: 1000 });
    expect(result.body).toHaveLength(1000);
    // parse: 'none' leaves the body to the caller, whatever its length.
    const unread = await client.get('/a', { parse: 'none' });
    expect(await unread.response.text()).toHaveLength(1000);
  });

  it('takes a positive whole number or Infinity, nothing else', () => {
    for (const bad of [0, -1, 1.5, Number.NaN, '10' as unknown as number]) {
      expect(() => setup([], { maxResponseBytes: bad })).toThrow(TypeError);
    }
    expect(() => setup([], { maxResponseBytes: Number.POSITIVE_INFINITY })).not.toThrow();
  });
});

describe('redirects', () => {
  function recordingFetch(answer: () => Response) {
    const modes: (RequestRedirect | undefined)[] = [];
    const fetch: ClientOptions['fetch'] = async (_input, init) => {
      modes.push(init.redirect);
      return answer();
    };
    return { fetch, modes };
  }

  it('asks fetch not to follow them: a write takes its 3xx as its answer, a read is followed by the client', async () => {
    const { fetch, modes } = recordingFetch(() => empty(200));
    const { client } = setup([], { fetch });
    await client.post('/charges', {});
    await client.post('/charges', {}, { idempotencyKey: false });
    await client.put('/settings', {}, { idempotencyKey: 'k-put' });
    await client.get('/stock');
    await client.put('/settings', {});
    expect(modes).toEqual(['manual', 'manual', 'manual', 'manual', 'manual']);
  });

  it("a read's redirects keep the client's headers on its origin and drop them for any other", async () => {
    const seen: { url: string; method: string; headers: Headers; body: unknown }[] = [];
    const hops: Record<string, Response | (() => Response)> = {};
    const fetch: ClientOptions['fetch'] = async (input, init) => {
      seen.push({ url: input, method: String(init.method), headers: new Headers(init.headers), body: init.body });
      const answer = hops[input] ?? empty(200);
      return typeof answer === 'function' ? answer() : answer;
    };
    const redirect = (status: number, location: string) => () => new Response(null, { status, headers: { location } });
    const client = createClient({
      baseUrl: 'https://api.example.test/',
      fetch,
      headers: { 'x-api-key': 'sk_live_1', accept: 'application/json' },
      getToken: () => 'bearer-1',
    });
    hops['https://api.example.test/stock'] = redirect(302, '/stock/v2');
    hops['https://api.example.test/stock/v2'] = redirect(301, 'https://cdn.example.test/stock');
    hops['https://cdn.example.test/stock'] = redirect(307, 'https://api.example.test/back');
    const result = await client.get('/stock');
    expect(result.status).toBe(200);
    expect(result.response.redirected).toBe(true);
    expect(
      seen.map((r) => [r.url, r.headers.get('x-api-key'), r.headers.get('authorization'), r.headers.get('accept')]),
    ).toEqual([
      ['https://api.example.test/stock', 'sk_live_1', 'Bearer bearer-1', 'application/json'],
      ['https://api.example.test/stock/v2', 'sk_live_1', 'Bearer bearer-1', 'application/json'],
      // Another origin: the client's own headers and the credentials stay behind, the rest goes on.
      ['https://cdn.example.test/stock', null, null, null],
      // Back on the origin after a hop elsewhere: still without them.
      ['https://api.example.test/back', null, null, null],
    ]);
    // A 303 turns an unkeyed PUT into a GET without its body, as fetch does.
    seen.length = 0;
    hops['https://api.example.test/settings'] = redirect(303, '/settings/done');
    await client.put('/settings', { theme: 'dark' });
    expect(seen.map((r) => [r.method, r.body === undefined, r.headers.get('content-type')])).toEqual([
      ['PUT', false, 'application/json'],
      ['GET', true, null],
    ]);
    // More than 20 hops is not followed, as in fetch; the 21st redirect is the read's answer, and
    // a failure that no retry changes (fresh-eyes.audit.int.test.ts).
    seen.length = 0;
    hops['https://api.example.test/loop'] = redirect(302, '/loop');
    const looped = await failure(client.get('/loop'));
    expect([looped.code, looped.status, seen.length]).toEqual(['http_error', 302, 21]);
    // A location that is no http(s) URL is not followed.
    seen.length = 0;
    hops['https://api.example.test/odd'] = redirect(302, 'ftp://files.example.test/x');
    expect([(await failure(client.get('/odd'))).code, seen.length]).toEqual(['http_error', 1]);
  });

  it("sends a read again with redirect: 'follow' where redirects are opaque (a browser)", async () => {
    const modes: (RequestRedirect | undefined)[] = [];
    const fetch: ClientOptions['fetch'] = async (_input, init) => {
      modes.push(init.redirect);
      if (init.redirect === 'follow') return json(200, { here: true });
      const opaque = new Response(null, { status: 200 });
      Object.defineProperty(opaque, 'type', { value: 'opaqueredirect' });
      Object.defineProperty(opaque, 'status', { value: 0 });
      return opaque;
    };
    const { client } = setup([], { fetch });
    expect((await client.get('/stock')).body).toEqual({ here: true });
    expect(modes).toEqual(['manual', 'follow']);
  });

  it("follows an opaque redirect without the client-wide headers, and asks a read carrying them with 'manual' first ever after", async () => {
    const sent: { redirect: RequestRedirect | undefined; key: string | null; token: string | null }[] = [];
    const fetch: ClientOptions['fetch'] = async (input, init) => {
      const headers = new Headers(init.headers);
      sent.push({ redirect: init.redirect, key: headers.get('x-api-key'), token: headers.get('authorization') });
      if (init.redirect === 'follow' || input.endsWith('/plain')) return json(200, { here: true });
      const opaque = new Response(null, { status: 200 });
      Object.defineProperty(opaque, 'type', { value: 'opaqueredirect' });
      Object.defineProperty(opaque, 'status', { value: 0 });
      return opaque;
    };
    const { client } = setup([], { fetch, headers: { 'X-Api-Key': 'sk_1' }, getToken: () => 'token_1' });
    await client.get('/moved');
    await client.get('/plain');
    await client.get('/moved');
    expect(sent).toEqual([
      { redirect: 'manual', key: 'sk_1', token: 'Bearer token_1' },
      // Where the browser takes it cannot be read: the key stays behind, the token is fetch's to drop.
      { redirect: 'follow', key: null, token: 'Bearer token_1' },
      // Not redirected: one request, with the key, as before the client met an opaque redirect.
      { redirect: 'manual', key: 'sk_1', token: 'Bearer token_1' },
      { redirect: 'manual', key: 'sk_1', token: 'Bearer token_1' },
      { redirect: 'follow', key: null, token: 'Bearer token_1' },
    ]);
  });

  it("ends with redirect_unreadable on a browser's opaque redirect, with the key to retry with", async () => {
    const { fetch } = recordingFetch(() => {
      const opaque = new Response(null, { status: 200 });
      Object.defineProperty(opaque, 'type', { value: 'opaqueredirect' });
      Object.defineProperty(opaque, 'status', { value: 0 });
      return opaque;
    });
    const { client } = setup([], { fetch });
    const error = await failure(client.post('/charges', {}, { idempotencyKey: 'k-7' }));
    expect([error.code, error.key, error.attempts.length]).toEqual(['redirect_unreadable', 'k-7', 1]);
  });
});

describe('paths and methods fetch cannot take', () => {
  it("refuses a '.' or '..' segment in any spelling: an id of '..' would reach another endpoint with the token", async () => {
    const { client, seen } = setup([json(200, {})]);
    for (const path of ['/photos/..', '/photos/%2e%2E/admin', '/photos/.%2e', '/a/./b', '/photos\\..\\admin', '..']) {
      await expect(client.get(path), path).rejects.toThrow(TypeError);
    }
    expect(seen).toHaveLength(0);
    // Dots inside a segment, or after the query starts, are plain characters.
    await client.get('/photos/a..b/.hidden', { query: { q: '..' } });
    await client.get('/search?q=../x');
    expect(seen.map((request) => new URL(request.url).pathname)).toEqual(['/v1/photos/a..b/.hidden', '/v1/search']);
  });

  it('refuses CONNECT, TRACE and TRACK at once instead of retrying what fetch refuses every time', async () => {
    const { client, seen } = setup([json(200, {})]);
    for (const method of ['CONNECT', 'trace', 'TRACK']) {
      await expect(client.request(method, '/x')).rejects.toThrow(TypeError);
    }
    expect(seen).toHaveLength(0);
  });
});
