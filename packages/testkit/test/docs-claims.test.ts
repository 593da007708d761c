// Documentation claims checked against behaviour (docs audit).
// Each test pins a claim a page makes: ones that had been false (now mended in the page or the
// code), and ones that were true but that no test held.
import type { AddressInfo } from 'node:net';
import { connect } from 'node:net';
import { createClient, isRequestFailedError } from '@idem/client';
import {
  createHttpIdempotency,
  createIdempotency,
  type IdempotencyEvent,
  memoryStore,
  parseIdempotencyKey,
  type Store,
  type StoredResponse,
} from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { transactionalMemoryStore } from '@idem/testkit';
import express from 'express';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';

const MIB = 1_048_576;
const ok = (status = 201, body = '{}'): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(body),
});
const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'abc' };

describe('documentation claims that had been false', () => {
  // docs/reliability.md listed, as a known bug, that @idem/fastify held a request declaring 10 GB open
  // until requestTimeout. readStream() checks the declared length first: the answer is 413 at once.
  it('reliability.md: Fastify answers 413 to a request that declares 10 GB, without waiting for the bytes', async () => {
    const app = Fastify();
    await app.register(fastifyIdempotency, { store: memoryStore(), scope: () => 'demo', maxBodyBytes: 64 * 1024 });
    app.post('/charges', async (_request, reply) => reply.code(201).send({ ok: true }));
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const { port } = app.server.address() as AddressInfo;
      const answer = await new Promise<string>((resolve) => {
        const socket = connect(port, '127.0.0.1');
        let data = '';
        const timer = setTimeout(() => {
          socket.destroy();
          resolve(data);
        }, 1_500);
        socket.on('data', (chunk) => {
          data += chunk.toString('latin1');
          if (data.includes('\r\n\r\n')) {
            clearTimeout(timer);
            socket.destroy();
            resolve(data);
          }
        });
        socket.on('error', () => undefined);
        socket.write(
          'POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: "k-10gb"\r\nContent-Type: application/json\r\n' +
            `Content-Length: ${10 * 1024 ** 3}\r\n\r\n{}`,
        );
      });
      expect(answer).toMatch(/^HTTP\/1\.1 413 /);
    } finally {
      await app.close();
    }
  });

  // docs/operations.md: the `complete` event carries `status`, `durationMs`, `executionMs`, and a
  // declined outcome emits `not-stored`; engine.transaction() emitted neither the status nor that event.
  it('operations.md: the complete event carries status, and not-stored is emitted, in transactional mode too', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store: transactionalMemoryStore(), onEvent: (event) => events.push(event) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    const result = await engine.transaction(started.lease, async () => ({ value: 1, response: ok(201) }));
    expect(result).toMatchObject({ committed: true, stored: true });
    const complete = events.find((event) => event.type === 'complete');
    expect(complete).toMatchObject({ type: 'complete', status: 201 });
    const declined = createIdempotency({
      store: transactionalMemoryStore(),
      storeOutcome: 'success',
      onEvent: (event) => events.push(event),
    });
    const again = await declined.begin({ ...request, key: 'k-2' });
    if (again.kind !== 'execute') throw new Error('expected execute');
    events.length = 0;
    expect(await declined.transaction(again.lease, async () => ({ value: 1, response: ok(500) }))).toMatchObject({
      committed: true,
      stored: false,
    });
    expect(events.map((event) => event.type)).toEqual(['release', 'not-stored']);
    expect(events[1]).toMatchObject({ status: 500 });
  });

  // docs/errors.md said every 4xx but 409 and 429 is final for @idem/client; 408 and 425 are retried
  // where a repeat is safe (client.md, retry-decision.ts), as the page now says.
  it('errors.md: @idem/client retries a 408 of a keyed POST', async () => {
    let calls = 0;
    const client = createClient({
      baseUrl: 'http://api.test',
      fetch: async () => {
        calls++;
        return calls === 1
          ? new Response('', { status: 408 })
          : new Response('{"id":"ch_1"}', { status: 201, headers: { 'content-type': 'application/json' } });
      },
      sleep: async () => undefined,
      random: () => 0,
    });
    const outcome = await client.post('/charges', { amount: 1 }).then(
      () => 'resolved',
      (error) => (isRequestFailedError(error) ? error.code : 'other'),
    );
    expect(outcome).toBe('resolved');
    expect(calls).toBe(2);
  });

  // docs/migrating.md said "visible ASCII"; a quoted key may hold spaces (sf-string): printable ASCII.
  it('migrating.md: a key is printable ASCII, so a quoted key may hold a space; a control character is refused', () => {
    expect(parseIdempotencyKey('"a b"').ok).toBe(true);
    expect(parseIdempotencyKey('"a\tb"').ok).toBe(false);
  });

  // docs/concepts.md said per-outcome retentions over 3650 days are refused at construction. One comes
  // from a function and is checked when returned: a `policy-error`, and the default retention.
  it('concepts.md: a per-outcome retention over 3650 days is a policy-error, and the outcome keeps the default retention', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: memoryStore(),
      storeOutcome: () => ({ store: true, retention: '3651d' }),
      onEvent: (event) => events.push(event),
    });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    expect(await engine.complete(started.lease, ok(201))).toEqual({ ok: true, stored: true });
    expect(events.map((event) => event.type)).toContain('policy-error');
    expect((await engine.begin(request)).kind).toBe('replay');
  });
});

describe('documentation claims pinned', () => {
  // concepts.md:188-190, express/fastify/koa README `storeOutcome` rows: `all` releases 401, 403 and 429;
  // `stripe` releases 401, 429 and thrown handlers only (a 403 is stored); `success` releases a thrown
  // handler even with a 2xx. The existing preset test has no 403 and no thrown row for these.
  it('storeOutcome presets: 403 and thrown handlers as concepts.md documents', async () => {
    const cases: Array<['all' | 'success' | 'stripe', number, boolean, boolean]> = [
      ['all', 403, false, false],
      ['all', 500, true, true],
      ['stripe', 403, false, true],
      ['stripe', 401, false, false],
      ['stripe', 500, true, false],
      ['success', 201, true, false],
      ['success', 201, false, true],
    ];
    for (const [policy, status, thrown, stored] of cases) {
      const engine = createIdempotency({ store: memoryStore(), storeOutcome: policy });
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('expected execute');
      expect(await engine.complete(started.lease, ok(status), { thrown }), `${policy} ${status} ${thrown}`).toEqual({
        ok: true,
        stored,
      });
    }
  });

  // core README options table and concepts.md: lease 10 s, retention 24 h, storeTimeout 2 s, wait and
  // maxExecution off, Retry-After 2 on 503.
  it('engine defaults are the documented ones', () => {
    expect(createIdempotency({ store: memoryStore() }).settings).toEqual({
      retentionMs: 86_400_000,
      leaseMs: 10_000,
      waitMs: 0,
      storeTimeoutMs: 2_000,
      maxExecutionMs: 0,
      unavailableRetryAfter: 2,
      // memoryStore's maxBytes (256 MiB): no one record may be larger.
      storeMaxResponseBytes: 268_435_456,
    });
  });

  // operations.md:51, stores.md:15: memoryStore's maxEntries defaults to 100,000.
  it('memoryStore holds 100,000 records by default, then evicts the completed one nearest its end', () => {
    const store = memoryStore({ now: () => 1_000 });
    const response = ok();
    for (let i = 0; i <= 100_000; i++) {
      const id = `r${i}`;
      store.claim({ id, token: 't', fingerprint: '', leaseMs: 10_000 });
      store.complete({ id, token: 't', response, retentionMs: 86_400_000 + i });
    }
    expect(store.size).toBe(100_000);
    expect(store.evicted).toBe(1);
  });

  // The adapters' README option tables: methods ['POST', 'PATCH'], maxBodyBytes 1 MiB; errors.md:51-52
  // Retry-After 1 on 409 and 2 on 503; every problem answer is `Cache-Control: no-store`.
  describe('adapter defaults (framework-free half)', () => {
    const info = (method: string, key: string, body?: Uint8Array) => ({
      method,
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: 'application/json',
      keyHeader: key,
      body,
      scope: 'user:alice',
    });

    it('covers POST and PATCH only, and refuses a body over 1 MiB', async () => {
      const http = createHttpIdempotency({ store: memoryStore() });
      expect(['POST', 'PATCH', 'PUT', 'DELETE'].map((m) => http.covers(m))).toEqual([true, true, false, false]);
      expect((await http.begin(info('PUT', 'k-put'))).kind).toBe('pass');
      const over = await http.begin(info('POST', 'k-big', new Uint8Array(MIB + 1)));
      expect(over).toMatchObject({ kind: 'respond', response: { status: 413 } });
      expect((await http.begin(info('POST', 'k-max', new Uint8Array(MIB)))).kind).toBe('execute');
    });

    it('answers 409 with Retry-After 1 and 503 with Retry-After 2, both no-store problem+json', async () => {
      const http = createHttpIdempotency({ store: memoryStore() });
      expect((await http.begin(info('POST', 'k-1'))).kind).toBe('execute');
      const conflict = await http.begin(info('POST', 'k-1'));
      if (conflict.kind !== 'respond') throw new Error('expected respond');
      expect(conflict.response.status).toBe(409);
      expect(conflict.response.headers).toMatchObject({
        'retry-after': '1',
        'cache-control': 'no-store',
        'content-type': 'application/problem+json',
      });
      const broken: Store = {
        ...memoryStore(),
        inProcess: false,
        claim: async () => {
          throw new Error('down');
        },
      };
      const down = await createHttpIdempotency({ store: broken }).begin(info('POST', 'k-2'));
      if (down.kind !== 'respond') throw new Error('expected respond');
      expect(down.response.status).toBe(503);
      expect(down.response.headers).toMatchObject({ 'retry-after': '2', 'cache-control': 'no-store' });
    });
  });

  // Adapter READMEs: maxResponseBytes defaults to 1 MiB; a larger response is served but not stored
  // (response-not-stored, reason too-large), and the default policy keeps the key: the retry gets
  // 500 response_not_replayable and does not run again.
  it('Express: a response body over 1 MiB is served, not stored; one of 1 MiB is stored', async () => {
    const events: IdempotencyEvent[] = [];
    let runs = 0;
    const app = express();
    app.use(expressIdempotency({ store: memoryStore(), scope: () => 'demo', onEvent: (e) => events.push(e) }));
    app.post('/big/:size', (req, res) => {
      runs++;
      res
        .status(201)
        .type('application/octet-stream')
        .send(Buffer.alloc(Number(req.params.size), 0x61));
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      const post = async (size: number, key: string) => {
        const response = await fetch(`http://127.0.0.1:${port}/big/${size}`, {
          method: 'POST',
          headers: { 'idempotency-key': key },
        });
        return { status: response.status, bytes: (await response.arrayBuffer()).byteLength };
      };
      expect(await post(MIB + 1, 'over')).toEqual({ status: 201, bytes: MIB + 1 });
      const retried = await post(MIB + 1, 'over');
      expect(retried.status).toBe(500);
      expect(runs).toBe(1);
      expect(events.filter((e) => e.type === 'response-not-stored')).toMatchObject([{ reason: 'too-large' }]);
      expect(await post(MIB, 'max')).toEqual({ status: 201, bytes: MIB });
      expect(await post(MIB, 'max')).toEqual({ status: 201, bytes: MIB });
      expect(runs).toBe(2);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });

  // client.md:115-123 and :154: the retry defaults (5 attempts, 10 s timeout, 60 s maxRetryAfter and
  // deadline) give a 60 s horizon; without a deadline it is the sum of timeouts and longest waits.
  it('client: documented retry defaults give the documented horizons', () => {
    const client = createClient({ baseUrl: 'http://api.test', fetch: async () => new Response('') });
    expect(client.retryHorizon()).toBe(60_000);
    // 4 retries x (10 s timeout + max(backoff ceiling, 60 s maxRetryAfter + its 1 s spread)) = 284 s.
    expect(client.retryHorizon({ deadline: false })).toBe(284_000);
  });
});
