import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { principalScope, recordId } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { startTestStack, type TestStack } from './test-stack.js';

// HTTP-level tests of the API's endpoints, always through the gateway, with tokens of a test issuer.
let test: TestStack;
let redis: TestStack['redis'];
let db: Database;
let stack: RunningResourceStack;

beforeAll(async () => {
  test = await startTestStack('api');
  ({ db, stack, redis } = test);
  // Starting three servers and a database is slow on a loaded 2-core machine; nothing here waits on time.
}, 60_000);

afterAll(async () => {
  await test?.close();
});

function token(
  sub = 'user-alice',
  options: { scope?: string; roles?: string[]; clientId?: string } = {},
): Promise<string> {
  return test.token({ sub, ...options });
}

interface Call {
  status: number;
  headers: Headers;
  body: any;
}

async function call(
  method: string,
  path: string,
  options: {
    as?: string;
    body?: unknown;
    raw?: string | Uint8Array<ArrayBuffer>;
    headers?: Record<string, string>;
    roles?: string[];
    scope?: string;
    /** The OAuth client acting for the user (`client_id`); default `photo-app`. */
    client?: string;
  } = {},
): Promise<Call> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${await token(options.as, {
      ...(options.roles ? { roles: options.roles } : {}),
      ...(options.scope ? { scope: options.scope } : {}),
      ...(options.client ? { clientId: options.client } : {}),
    })}`,
    ...options.headers,
  };
  let body: string | Uint8Array<ArrayBuffer> | undefined = options.raw;
  if (options.body !== undefined) {
    body = JSON.stringify(options.body);
    headers['content-type'] ??= 'application/json';
  }
  const response = await fetch(new URL(path, stack.gateway.url), {
    method,
    headers,
    ...(body === undefined ? {} : { body }),
  });
  const text = await response.text();
  let parsed: unknown = text;
  if (/json/.test(response.headers.get('content-type') ?? '')) parsed = JSON.parse(text);
  return { status: response.status, headers: response.headers, body: parsed };
}

async function count(sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await db.query<{ n: number }>(`select count(*)::int as n from ${sql}`, params);
  return rows[0]?.n ?? -1;
}

describe('POST /charges', () => {
  it('mints a key when none is sent, returns it with the 201, and replays with it', async () => {
    const first = await call('POST', '/charges', { body: { amount: 1200, currency: 'EUR' } });
    expect(first.status).toBe(201);
    const key = first.headers.get('idempotency-key');
    expect(key).toBeTruthy();
    expect(first.body).toMatchObject({ amount: 1200, currency: 'EUR', status: 'succeeded' });
    const chargeId = first.body.id as string;
    expect(await count('api_charges where id = $1', [chargeId])).toBe(1);

    const replay = await call('POST', '/charges', {
      body: { amount: 1200, currency: 'EUR' },
      headers: { 'idempotency-key': key as string },
    });
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.body).toEqual(first.body);
    expect(await count('api_charges where idempotency_key = $1', [key])).toBe(1);
  });

  it('20 concurrent requests with one key make one charge; the others get 409 or the replay', async () => {
    const key = `"${randomUUID()}"`;
    const responses = await Promise.all(
      Array.from({ length: 20 }, () =>
        call('POST', '/charges', { body: { amount: 500, currency: 'USD' }, headers: { 'idempotency-key': key } }),
      ),
    );
    const statuses = responses.map((response) => response.status);
    expect(statuses.every((status) => status === 201 || status === 409)).toBe(true);
    const created = responses.filter((response) => response.status === 201);
    expect(created.length).toBeGreaterThanOrEqual(1);
    expect(new Set(created.map((response) => response.body.id)).size).toBe(1);
    // Exactly one execution: every other 201 is a replay of it.
    expect(created.filter((response) => response.headers.get('idempotent-replayed') !== 'true')).toHaveLength(1);
    for (const conflict of responses.filter((response) => response.status === 409)) {
      expect(conflict.headers.get('retry-after')).toBeTruthy();
      expect(conflict.body).toMatchObject({ code: 'in_progress' });
    }
    const chargeId = created[0]?.body.id as string;
    expect(await count('api_charges where idempotency_key = $1', [key.slice(1, -1)])).toBe(1);
    // One event per charge: the outbox row committed with the charge, once.
    expect(await count('api_webhook_outbox where id = $1', [`evt_${chargeId}`])).toBe(1);
  }, 60_000);

  it('refuses the same key with another amount (422) and charges nothing more', async () => {
    const key = `"${randomUUID()}"`;
    const first = await call('POST', '/charges', {
      body: { amount: 700, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(first.status).toBe(201);
    const other = await call('POST', '/charges', {
      body: { amount: 701, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(other.status).toBe(422);
    expect(other.headers.get('content-type')).toContain('application/problem+json');
    expect(other.body).toMatchObject({ code: 'fingerprint_mismatch' });
    expect(await count('api_charges where idempotency_key = $1', [key.slice(1, -1)])).toBe(1);
  });

  it("keeps keys per caller: bob's request with alice's key is bob's own charge", async () => {
    const key = `"${randomUUID()}"`;
    const alice = await call('POST', '/charges', {
      body: { amount: 300, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    const bob = await call('POST', '/charges', {
      as: 'user-bob',
      body: { amount: 300, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(alice.status).toBe(201);
    expect(bob.status).toBe(201);
    expect(bob.headers.get('idempotent-replayed')).toBeNull();
    expect(bob.body.id).not.toBe(alice.body.id);
  });

  it('keeps keys per user and client: another client of the same user with the same key is its own charge', async () => {
    const key = `"${randomUUID()}"`;
    const charge = (client: string, amount: number) =>
      call('POST', '/charges', { client, body: { amount, currency: 'EUR' }, headers: { 'idempotency-key': key } });
    const app = await charge('photo-app', 310);
    expect(app.status).toBe(201);
    // The same request from another client: its own execution, not the photo app's stored answer.
    const cli = await charge('cli-pkce', 310);
    expect(cli.status).toBe(201);
    expect(cli.headers.get('idempotent-replayed')).toBeNull();
    expect(cli.body.id).not.toBe(app.body.id);
    // Another request from a third client: its own charge, not a 422 for a request it never sent.
    const third = await charge('ops-console', 320);
    expect(third.status).toBe(201);
    expect(third.body).toMatchObject({ amount: 320 });
    // Each client's retry still replays its own answer.
    const retry = await charge('cli-pkce', 310);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.body.id).toBe(cli.body.id);
    expect(await count('api_charges where idempotency_key = $1', [key.slice(1, -1)])).toBe(3);
  });

  it.each([
    [{ amount: 0, currency: 'EUR' }, ['amount']],
    [{ amount: -5, currency: 'EUR' }, ['amount']],
    [{ amount: 10.5, currency: 'EUR' }, ['amount']],
    [{ amount: '100', currency: 'EUR' }, ['amount']],
    [{ amount: 100, currency: 'euro' }, ['currency']],
    [{ amount: 100 }, ['currency']],
    [{ amount: 100, currency: 'EUR', status: 'refunded' }, ['status']],
    [{ amount: 100_000_001, currency: 'EUR' }, ['amount']],
    [{ amount: 2 ** 53, currency: 'EUR' }, ['amount']],
    // Three capital letters and nothing else: the pattern is anchored at both ends.
    [{ amount: 100, currency: 'EURO' }, ['currency']],
    [{ amount: 100, currency: 'xEUR' }, ['currency']],
  ])('refuses %j with 422 naming %j, without using up the key', async (body, invalid) => {
    const key = `"${randomUUID()}"`;
    const refused = await call('POST', '/charges', { body, headers: { 'idempotency-key': key } });
    expect(refused.status).toBe(422);
    expect(refused.body).toMatchObject({ code: 'validation_failed', invalid });
    const fixed = await call('POST', '/charges', {
      body: { amount: 100, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(fixed.status).toBe(201);
  });

  it('needs charges:write: a token without it charges nothing, and leaves the key free', async () => {
    const key = `"${randomUUID()}"`;
    const before = await count('api_charges');
    const refused = await call('POST', '/charges', {
      scope: 'photos:read photos:write stock:read settings:read settings:write',
      body: { amount: 100, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(refused.status).toBe(403);
    expect(refused.headers.get('www-authenticate')).toContain('scope="charges:write"');
    expect(refused.body).toMatchObject({ code: 'insufficient_scope' });
    expect(await count('api_charges')).toBe(before);
    const allowed = await call('POST', '/charges', {
      body: { amount: 100, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(allowed.status).toBe(201);
    expect(allowed.headers.get('idempotent-replayed')).toBeNull();
  });

  it('accepts the bounds of an amount, 1 and 100 000 000', async () => {
    for (const amount of [1, 100_000_000]) {
      const made = await call('POST', '/charges', { body: { amount, currency: 'EUR' } });
      expect(made.status).toBe(201);
      expect(made.body).toMatchObject({ amount, currency: 'EUR' });
    }
  });

  it('answers 400 for malformed JSON, 415 for another media type, 413 for a large body', async () => {
    expect(
      (await call('POST', '/charges', { raw: '{"amount":', headers: { 'content-type': 'application/json' } })).body,
    ).toMatchObject({ status: 400, code: 'body_malformed' });
    expect(
      (await call('POST', '/charges', { raw: 'amount=1', headers: { 'content-type': 'text/plain' } })).body,
    ).toMatchObject({ status: 415, code: 'unsupported_media_type' });
    const large = await call('POST', '/charges', { body: { amount: 1, currency: 'EUR', pad: 'x'.repeat(10_000) } });
    expect(large.status).toBe(413);
    expect(large.body).toMatchObject({ code: 'body_too_large' });
  });

  it('refuses a JSON array as the body with 422: a body must be an object, whatever its items', async () => {
    for (const [method, path] of [
      ['POST', '/charges'],
      ['PUT', '/settings'],
      ['PUT', '/stock/item-1'],
    ] as const) {
      const refused = await call(method, path, {
        roles: ['admin'],
        body: [{ amount: 100, currency: 'EUR', theme: 'dark', level: 1 }],
      });
      expect(refused.body, path).toMatchObject({ status: 422, code: 'validation_failed', invalid: [] });
    }
  });

  it('answers 415 for JSON in a charset other than UTF-8, and keeps the key free', async () => {
    const key = `"${randomUUID()}"`;
    const latin1 = await call('POST', '/charges', {
      raw: '{"amount":100,"currency":"EUR"}',
      headers: { 'content-type': 'application/json; charset=latin1', 'idempotency-key': key },
    });
    expect(latin1.status).toBe(415);
    expect(latin1.headers.get('content-type')).toContain('application/problem+json');
    expect(latin1.body).toMatchObject({ status: 415, code: 'unsupported_media_type' });
    expect(
      (await call('POST', '/charges', { body: { amount: 100, currency: 'EUR' }, headers: { 'idempotency-key': key } }))
        .status,
    ).toBe(201);
  });

  it('commits the charge and its event together: a failing outbox write leaves no charge, and the key free', async () => {
    const key = `"${randomUUID()}"`;
    const before = await count('api_charges');
    // The event cannot be written: the transaction must take the charge row down with it.
    await db.exec('alter table api_webhook_outbox rename to api_webhook_outbox_away');
    let failed: Call;
    try {
      failed = await call('POST', '/charges', {
        body: { amount: 800, currency: 'EUR' },
        headers: { 'idempotency-key': key },
      });
    } finally {
      await db.exec('alter table api_webhook_outbox_away rename to api_webhook_outbox');
    }
    expect(failed.status).toBe(500);
    // It says so, or a client that honours `retryable` (@idem/client) would never send the retry below.
    expect(failed.body).toMatchObject({ code: 'internal_error', retryable: true });
    expect(await count('api_charges')).toBe(before);
    // Nothing happened, so the same key runs again (no replayed 500) and now commits both rows.
    const retried = await call('POST', '/charges', {
      body: { amount: 800, currency: 'EUR' },
      headers: { 'idempotency-key': key },
    });
    expect(retried.status).toBe(201);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
    expect(await count('api_charges')).toBe(before + 1);
    expect(await count('api_webhook_outbox where id = $1', [`evt_${retried.body.id}`])).toBe(1);
  });

  it('answers 400 for a malformed Idempotency-Key', async () => {
    const response = await call('POST', '/charges', {
      body: { amount: 100, currency: 'EUR' },
      headers: { 'idempotency-key': 'x'.repeat(300) },
    });
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toContain('application/problem+json');
  });
});

describe('stock', () => {
  it('GET /stock?item= gives one level; unknown items are 404; a missing id is 422', async () => {
    expect(await call('GET', '/stock?item=item-5')).toMatchObject({ status: 200, body: { item: 'item-5', level: 35 } });
    expect((await call('GET', '/stock?item=item-9999')).body).toMatchObject({ status: 404, code: 'unknown_item' });
    expect((await call('GET', '/stock')).body).toMatchObject({ status: 422, code: 'validation_failed' });
  });

  it('needs stock:read', async () => {
    expect((await call('GET', '/stock?item=item-1', { scope: 'photos:read' })).status).toBe(403);
    // The batch is a read too, under the same scope.
    const batch = await call('POST', '/stock/batch', { scope: 'photos:read', body: { items: ['item-1'] } });
    expect(batch.status).toBe(403);
    expect(batch.headers.get('www-authenticate')).toContain('scope="stock:read"');
  });

  it.each(['item%201', '%00', 'item-1%00', 'x'.repeat(65), 'item-1/..'])(
    'GET /stock?item=%s (not a possible item id) is 422 validation_failed, never looked up',
    async (item) => {
      const response = await call('GET', `/stock?item=${item}`);
      expect(response.status).toBe(422);
      expect(response.body).toMatchObject({ code: 'validation_failed', invalid: ['item'] });
    },
  );

  it('accepts an id of 64 characters, the longest one an item may have', async () => {
    expect((await call('GET', `/stock?item=${'x'.repeat(64)}`)).body).toMatchObject({
      status: 404,
      code: 'unknown_item',
    });
  });

  it('PUT /stock takes the bounds of a level, 0 and 1 000 000, and refuses beyond or between', async () => {
    const put = (level: unknown) => call('PUT', '/stock/item-13', { roles: ['admin'], body: { level } });
    expect(await put(0)).toMatchObject({ status: 200, body: { item: 'item-13', level: 0 } });
    expect(await put(1_000_000)).toMatchObject({ status: 200, body: { item: 'item-13', level: 1_000_000 } });
    for (const level of [1_000_001, 1.5, '5', null]) {
      expect((await put(level)).body, JSON.stringify(level)).toMatchObject({ status: 422, invalid: ['level'] });
    }
    expect((await call('GET', '/stock?item=item-13')).body.level).toBe(1_000_000);
  });

  it('PUT /stock/<id> answers an impossible id 404 before it reads the body', async () => {
    const response = await call('PUT', '/stock/item-1%00', {
      roles: ['admin'],
      raw: '{"level":',
      headers: { 'content-type': 'application/json' },
    });
    expect(response.status).toBe(404);
    expect(response.body).toMatchObject({ code: 'unknown_item' });
  });

  it('POST /stock/batch with 40 items returns 40 levels, in the order asked', async () => {
    const items = Array.from({ length: 40 }, (_, index) => `item-${80 - index}`);
    const response = await call('POST', '/stock/batch', { body: { items } });
    expect(response.status).toBe(200);
    expect(response.body.levels).toHaveLength(40);
    expect(response.body.levels.map((level: { item: string }) => level.item)).toEqual(items);
    for (const { item, level } of response.body.levels as Array<{ item: string; level: number }>) {
      expect(level).toBe((Number(item.slice('item-'.length)) * 7) % 50);
    }
  });

  it('accepts 100 items and refuses 101 with 422 too_many_items', async () => {
    const ids = (n: number) => Array.from({ length: n }, (_, index) => `item-${index + 1}`);
    expect((await call('POST', '/stock/batch', { body: { items: ids(100) } })).body.levels).toHaveLength(100);
    const refused = await call('POST', '/stock/batch', { body: { items: ids(101) } });
    expect(refused.status).toBe(422);
    expect(refused.body).toMatchObject({ code: 'too_many_items', maxItems: 100 });
  });

  it('refuses a batch with unknown items (404, listing them) and an empty or malformed batch (422)', async () => {
    const unknown = await call('POST', '/stock/batch', { body: { items: ['item-1', 'nope-1'] } });
    expect(unknown.status).toBe(404);
    expect(unknown.body).toMatchObject({ code: 'unknown_item', unknownItems: ['nope-1'] });
    expect((await call('POST', '/stock/batch', { body: { items: [] } })).status).toBe(422);
    expect((await call('POST', '/stock/batch', { body: { items: [1, 2] } })).status).toBe(422);
    // Ids no item can have are refused before any lookup, NUL (which PostgreSQL refuses) included.
    for (const item of ['item\u00001', 'item 1', 'x'.repeat(65)]) {
      expect((await call('POST', '/stock/batch', { body: { items: ['item-1', item] } })).body).toMatchObject({
        status: 422,
        code: 'validation_failed',
      });
    }
    expect((await call('POST', '/stock/batch', { body: ['item-1'] })).status).toBe(422);
    expect((await call('POST', '/stock/batch', { body: { items: ['item-1'], extra: true } })).body).toMatchObject({
      status: 422,
      invalid: ['extra'],
    });
  });

  it('PUT /stock/<id> sets an absolute level for an admin; twice leaves the same state', async () => {
    const first = await call('PUT', '/stock/item-10', { roles: ['admin'], body: { level: 42 } });
    const second = await call('PUT', '/stock/item-10', { roles: ['admin'], body: { level: 42 } });
    expect(first).toMatchObject({ status: 200, body: { item: 'item-10', level: 42 } });
    expect(second).toMatchObject({ status: 200, body: { item: 'item-10', level: 42 } });
    expect((await call('GET', '/stock?item=item-10')).body.level).toBe(42);
  });

  it('PUT /stock refuses non-admins (403), bad levels (422) and unknown items (404)', async () => {
    expect((await call('PUT', '/stock/item-11', { body: { level: 1 } })).status).toBe(403);
    expect((await call('PUT', '/stock/item-11', { roles: ['admin'], body: { level: -1 } })).body).toMatchObject({
      status: 422,
      invalid: ['level'],
    });
    expect((await call('PUT', '/stock/item-11', { roles: ['admin'], body: { delta: 1 } })).status).toBe(422);
    expect((await call('PUT', '/stock/nope', { roles: ['admin'], body: { level: 1 } })).status).toBe(404);
    expect((await call('GET', '/stock?item=item-11')).body.level).toBe(27);
  });

  it('PUT /stock needs the scope stock:write as well as the admin role: the role alone is not enough', async () => {
    const refused = await call('PUT', '/stock/item-12', {
      roles: ['admin'],
      scope: 'photos:read stock:read charges:write settings:read settings:write',
      body: { level: 1 },
    });
    expect(refused.status).toBe(403);
    expect(refused.headers.get('www-authenticate')).toContain('error="insufficient_scope"');
    expect(refused.headers.get('www-authenticate')).toContain('scope="stock:write"');
    expect((await call('GET', '/stock?item=item-12')).body.level).toBe(34);
  });

  it.each(['%00', 'item-1%00', 'item%0A1'])(
    'PUT /stock/%s (not a possible item id) is 404 unknown_item, not a 500',
    async (id) => {
      const response = await call('PUT', `/stock/${id}`, { roles: ['admin'], body: { level: 1 } });
      expect(response.status).toBe(404);
      expect(response.body).toMatchObject({ code: 'unknown_item' });
    },
  );
});

describe('bodies the parser refuses are 4xx problems, never a 500', () => {
  const batch = (raw: string | Uint8Array<ArrayBuffer>, contentEncoding: string) =>
    call('POST', '/stock/batch', {
      raw,
      headers: { 'content-type': 'application/json', 'content-encoding': contentEncoding },
    });

  it('answers 415 unsupported_media_type for an unknown Content-Encoding', async () => {
    const response = await batch('{"items":["item-1"]}', 'x-unknown');
    expect(response.status).toBe(415);
    expect(response.headers.get('content-type')).toContain('application/problem+json');
    expect(response.body).toMatchObject({ status: 415, code: 'unsupported_media_type' });
  });

  it('answers 400 body_malformed for a body that says gzip and is not', async () => {
    const response = await batch('not gzip at all', 'gzip');
    expect(response.status).toBe(400);
    expect(response.body).toMatchObject({ status: 400, code: 'body_malformed' });
  });

  it('still reads a body that really is gzip', async () => {
    const response = await batch(gzipSync('{"items":["item-1"]}'), 'gzip');
    expect(response.status).toBe(200);
    expect(response.body).toEqual({ levels: [{ item: 'item-1', level: 7 }] });
  });
});

describe('a method the path does not take', () => {
  it('answers 405 method_not_allowed with the Allow header the routes give, and runs nothing', async () => {
    const before = await count('api_charges');
    const cases: Array<[string, string, string]> = [
      ['GET', '/charges', 'POST, OPTIONS'],
      ['DELETE', '/charges', 'POST, OPTIONS'],
      ['POST', '/settings', 'GET, HEAD, PUT, OPTIONS'],
      ['PATCH', '/stock/item-1', 'PUT, OPTIONS'],
      ['GET', '/photos/abc', 'DELETE, OPTIONS'],
      ['PUT', '/photos', 'GET, HEAD, POST, OPTIONS'],
    ];
    for (const [method, path, allow] of cases) {
      const response = await call(method, path, { scope: 'charges:write photos:read photos:write stock:write' });
      expect(response.status, `${method} ${path}`).toBe(405);
      expect(response.headers.get('allow'), `${method} ${path}`).toBe(allow);
      expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(response.body).toMatchObject({ status: 405, code: 'method_not_allowed', retryable: false });
      expect(response.body.detail).toBe(`This resource takes ${allow}.`);
    }
    expect(await count('api_charges')).toBe(before);
  });

  it('answers OPTIONS on a routed path with 204 and Allow, and an unknown path still with 404', async () => {
    const options = await call('OPTIONS', '/charges');
    expect(options.status).toBe(204);
    expect(options.headers.get('allow')).toBe('POST, OPTIONS');
    const unknown = await call('DELETE', '/no/such/route');
    expect(unknown.status).toBe(404);
    expect(unknown.body).toMatchObject({ code: 'route_not_found' });
    expect(unknown.headers.get('allow')).toBeNull();
  });
});

describe('photos', () => {
  const ids = (response: Call) => (response.body.photos as Array<{ id: string }>).map((photo) => photo.id);

  it("GET /photos lists only the caller's photos", async () => {
    expect(ids(await call('GET', '/photos', { as: 'user-bob' }))).toEqual(['photo-bob-1', 'photo-bob-2']);
    // A user's own list: no shared cache may keep it.
    expect((await call('GET', '/photos', { as: 'user-bob' })).headers.get('cache-control')).toBe('private, no-store');
    const alice = ids(await call('GET', '/photos'));
    expect(alice.length).toBeGreaterThan(0);
    expect(alice.every((id) => id.startsWith('photo-alice-'))).toBe(true);
  });

  it('needs photos:read', async () => {
    expect((await call('GET', '/photos', { scope: 'stock:read' })).status).toBe(403);
  });

  it('DELETE twice: 204 both times, and the state after both is the state after the first', async () => {
    const first = await call('DELETE', '/photos/photo-alice-3');
    expect(first.status).toBe(204);
    const after = ids(await call('GET', '/photos'));
    const second = await call('DELETE', '/photos/photo-alice-3');
    expect(second.status).toBe(204);
    expect(ids(await call('GET', '/photos'))).toEqual(after);
    expect(after).not.toContain('photo-alice-3');
    const { rows } = await db.query<{ deleted_at: Date }>('select deleted_at from api_photos where id = $1', [
      'photo-alice-3',
    ]);
    expect(rows).toHaveLength(1);
    // The second DELETE changes nothing at all, not even the time of the deletion.
    const deletedAt = rows[0]?.deleted_at;
    expect((await call('DELETE', '/photos/photo-alice-3')).status).toBe(204);
    const again = await db.query<{ deleted_at: Date }>('select deleted_at from api_photos where id = $1', [
      'photo-alice-3',
    ]);
    expect(again.rows[0]?.deleted_at).toEqual(deletedAt);
  });

  it("cannot delete another user's photo (404, nothing changes)", async () => {
    const response = await call('DELETE', '/photos/photo-alice-1', { as: 'user-bob' });
    expect(response.status).toBe(404);
    expect(response.body).toMatchObject({ code: 'photo_not_found' });
    expect(ids(await call('GET', '/photos'))).toContain('photo-alice-1');
  });

  it.each(['%00', 'photo-alice-1%00', 'photo%0Aalice'])(
    'DELETE /photos/%s (not a possible photo id) is 404 photo_not_found, not a 500',
    async (id) => {
      const response = await call('DELETE', `/photos/${id}`);
      expect(response.status).toBe(404);
      expect(response.body).toMatchObject({ code: 'photo_not_found' });
      expect(ids(await call('GET', '/photos'))).toContain('photo-alice-1');
    },
  );

  it('DELETE needs photos:write', async () => {
    expect((await call('DELETE', '/photos/photo-alice-2', { scope: 'photos:read' })).status).toBe(403);
    expect(ids(await call('GET', '/photos'))).toContain('photo-alice-2');
  });
});

describe('POST /photos (non-transactional: keys in Redis with REDIS_URL, in SQL otherwise)', () => {
  const newPhoto = (title: string, key?: string, as?: string) =>
    call('POST', '/photos', {
      body: { title },
      ...(as ? { as } : {}),
      ...(key ? { headers: { 'idempotency-key': key } } : {}),
    });

  it('requires an Idempotency-Key (400 problem+json) and creates nothing without one', async () => {
    const before = await count('api_photos');
    const refused = await newPhoto('No key');
    expect(refused.status).toBe(400);
    expect(refused.headers.get('content-type')).toContain('application/problem+json');
    expect(await count('api_photos')).toBe(before);
  });

  it('creates one photo per key: the retry is a replay with the same id and Location', async () => {
    const key = `"${randomUUID()}"`;
    const first = await newPhoto('Cheshire cat', key);
    expect(first.status).toBe(201);
    expect(first.body).toMatchObject({ title: 'Cheshire cat' });
    expect(first.headers.get('location')).toBe(`/photos/${first.body.id}`);
    const retry = await newPhoto('Cheshire cat', key);
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.body).toEqual(first.body);
    expect(retry.headers.get('location')).toBe(first.headers.get('location'));
    expect(await count("api_photos where title = 'Cheshire cat'")).toBe(1);
    const listed = await call('GET', '/photos');
    expect(listed.body.photos.map((photo: { id: string }) => photo.id)).toContain(first.body.id);
  });

  it('keeps keys per user and client: the same key from another client of the same user is its own photo', async () => {
    const key = `"${randomUUID()}"`;
    const first = await call('POST', '/photos', { body: { title: 'Dodo' }, headers: { 'idempotency-key': key } });
    expect(first.status).toBe(201);
    const other = await call('POST', '/photos', {
      client: 'cli-pkce',
      body: { title: 'Dormouse' },
      headers: { 'idempotency-key': key },
    });
    expect(other.status).toBe(201);
    expect(other.body).toMatchObject({ title: 'Dormouse' });
    expect(other.body.id).not.toBe(first.body.id);
  });

  it('refuses the same key with another title (422) and creates nothing more', async () => {
    const key = `"${randomUUID()}"`;
    expect((await newPhoto('Mad hatter', key)).status).toBe(201);
    const other = await newPhoto('March hare', key);
    expect(other.status).toBe(422);
    expect(other.body).toMatchObject({ code: 'fingerprint_mismatch' });
    expect(await count("api_photos where title = 'March hare'")).toBe(0);
  });

  it('keeps the record where the configuration says: Redis when REDIS_URL is set, the SQL table otherwise', async () => {
    const key = `"${randomUUID()}"`;
    expect((await newPhoto('Queen of hearts', key)).status).toBe(201);
    const sqlRecords = await count('api_plain_idempotency_records');
    if (redis) {
      const keys = await redis.client.keys(`${redis.prefix}*`);
      expect(keys.length).toBeGreaterThan(0);
      expect(sqlRecords).toBe(0);
    } else {
      expect(sqlRecords).toBeGreaterThan(0);
    }
  });

  it('refuses an empty or long title and extra members (422, key not used up), and needs photos:write', async () => {
    const key = `"${randomUUID()}"`;
    expect((await newPhoto('', key)).body).toMatchObject({ status: 422, invalid: ['title'] });
    expect((await newPhoto('x'.repeat(101), key)).status).toBe(422);
    const extra = await call('POST', '/photos', {
      body: { title: 'ok', owner: 'user-bob' },
      headers: { 'idempotency-key': key },
    });
    expect(extra.body).toMatchObject({ status: 422, invalid: ['owner'] });
    expect((await newPhoto('White rabbit', key)).status).toBe(201);
    const noScope = await call('POST', '/photos', {
      scope: 'photos:read',
      body: { title: 'Dodo' },
      headers: { 'idempotency-key': `"${randomUUID()}"` },
    });
    expect(noScope.status).toBe(403);
  });

  it.each(['a\u0000b', 'bell\u0007', 'two\nlines', 'tab\there', 'csi\u009b'])(
    'refuses a title with a control character (%j) with 422, not a 500, without using up the key',
    async (title) => {
      const key = `"${randomUUID()}"`;
      const before = await count('api_photos');
      const refused = await newPhoto(title, key);
      expect(refused.status).toBe(422);
      expect(refused.body).toMatchObject({ code: 'validation_failed', invalid: ['title'] });
      expect(await count('api_photos')).toBe(before);
      expect((await newPhoto('Caterpillar', key)).status).toBe(201);
    },
  );

  it('creates the photo anew when its key was forgotten after the retention, though that photo was deleted', async () => {
    // Spec 3.1: once the retention expires the key is unseen, and a later request with it executes
    // fresh. The photo's id derives from the key and the body, so that run meets the tombstone of the
    // photo the first run made: `do nothing` answered 201 with a photo no GET lists.
    const raw = randomUUID();
    const first = await newPhoto('Mock turtle', `"${raw}"`);
    expect(first.status).toBe(201);
    expect((await call('DELETE', `/photos/${first.body.id}`)).status).toBe(204);
    // What the purge does once the retention is over: the store forgets the key.
    const id = recordId(
      principalScope({ iss: test.issuer, sub: 'user-alice', clientId: 'photo-app' }, { perClient: true }) ?? '',
      'POST /photos',
      raw,
    );
    const forgotten = redis
      ? await redis.client.del(`${redis.prefix}${id}`)
      : (await db.query('delete from api_plain_idempotency_records where id = $1', [id])).rowCount;
    expect(forgotten).toBe(1);
    const again = await newPhoto('Mock turtle', `"${raw}"`);
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    const listed = await call('GET', '/photos');
    expect(listed.body.photos.map((photo: { id: string }) => photo.id)).toContain(again.body.id);
  });

  it('does not keep a 500 under its key: nothing was created, so the retry with that key runs', async () => {
    const key = `"${randomUUID()}"`;
    // The insert fails: the photo cannot have been created.
    await db.exec('alter table api_photos rename to api_photos_away');
    let failed: Call;
    try {
      failed = await newPhoto('Gryphon', key);
    } finally {
      await db.exec('alter table api_photos_away rename to api_photos');
    }
    expect(failed.status).toBe(500);
    expect(failed.body).toMatchObject({ code: 'internal_error' });
    const retried = await newPhoto('Gryphon', key);
    expect(retried.status).toBe(201);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
    expect(await count("api_photos where title = 'Gryphon'")).toBe(1);
  });
});

describe('settings', () => {
  it('GET gives the defaults; PUT twice leaves the same state; other users are unaffected', async () => {
    expect((await call('GET', '/settings', { as: 'user-carol' })).body).toEqual({ theme: 'light' });
    expect((await call('GET', '/settings', { as: 'user-carol' })).headers.get('cache-control')).toBe(
      'private, no-store',
    );
    const first = await call('PUT', '/settings', { as: 'user-carol', body: { theme: 'dark' } });
    const second = await call('PUT', '/settings', { as: 'user-carol', body: { theme: 'dark' } });
    expect(first).toMatchObject({ status: 200, body: { theme: 'dark' } });
    expect(second).toMatchObject({ status: 200, body: { theme: 'dark' } });
    expect((await call('GET', '/settings', { as: 'user-carol' })).body).toEqual({ theme: 'dark' });
    expect(await count("api_settings where owner = 'user-carol'")).toBe(1);
    expect((await call('GET', '/settings', { as: 'user-dave' })).body).toEqual({ theme: 'light' });
  });

  it('refuses an unknown theme, extra members (PUT is the whole document) and a missing scope', async () => {
    expect((await call('PUT', '/settings', { body: { theme: 'purple' } })).body).toMatchObject({
      status: 422,
      invalid: ['theme'],
    });
    expect((await call('PUT', '/settings', { body: { theme: 'dark', font: 'serif' } })).body).toMatchObject({
      status: 422,
      invalid: ['font'],
    });
    expect((await call('PUT', '/settings', { scope: 'photos:read', body: { theme: 'dark' } })).status).toBe(403);
    // Reading is not writing: settings:read alone changes nothing.
    const readOnly = await call('PUT', '/settings', {
      as: 'user-erin',
      scope: 'settings:read',
      body: { theme: 'dark' },
    });
    expect(readOnly.status).toBe(403);
    expect(readOnly.headers.get('www-authenticate')).toContain('scope="settings:write"');
    expect((await call('GET', '/settings', { as: 'user-erin' })).body).toEqual({ theme: 'light' });
  });

  it('GET needs settings:read: a token without it reads nothing', async () => {
    const refused = await call('GET', '/settings', { scope: 'photos:read settings:write' });
    expect(refused.status).toBe(403);
    expect(refused.headers.get('www-authenticate')).toContain('scope="settings:read"');
    expect(refused.body).toMatchObject({ code: 'insufficient_scope' });
  });
});
