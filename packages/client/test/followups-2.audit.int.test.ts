import type { ServerResponse } from 'node:http';
import { createClient } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { fakeTime } from './support/fake-time.js';
import { closeServers, serve } from './support/logging-server.js';

afterEach(closeServers);

describe("parse: 'none': a retried answer's body", () => {
  // The body follows its headers a moment later, as it does whenever a server streams or the
  // network splits them: a body still on its way when it was cancelled cost the connection.
  function later(res: ServerResponse, send: () => void) {
    res.flushHeaders();
    setTimeout(send, 5);
  }
  // Real waits of 1 ms: the drain runs while the client waits, as it does between real attempts.
  const fakeClient = (url: string, retry: Record<string, unknown> = {}) =>
    createClient({ baseUrl: url, retry: { baseDelay: '1ms', maxDelay: '1ms', jitter: 'none', ...retry } });

  it('Was wrong: a small body was cancelled, closing the socket (9 connections for 5 attempts); it is drained and the connection reused', async () => {
    const s = await serve((_req, res) => {
      const body = 'down for a moment\n'.repeat(100);
      res.writeHead(503, { 'content-type': 'text/plain', 'content-length': String(body.length) });
      later(res, () => res.end(body));
    });
    const error = await failure(fakeClient(s.url).get('/x', { parse: 'none' }));
    expect(error.code).toBe('attempts_exhausted');
    expect(s.log).toHaveLength(5);
    expect(s.connections()).toBe(1);
  });

  it('Was wrong: a small chunked body (no Content-Length) is drained too', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.write('down ');
      later(res, () => res.end('for a moment'));
    });
    const error = await failure(fakeClient(s.url).get('/x', { parse: 'none' }));
    expect(error.code).toBe('attempts_exhausted');
    expect(s.log).toHaveLength(5);
    expect(s.connections()).toBe(1);
  });

  it('a body declared over the cap (64 KiB) is still cancelled, not read: a new connection per attempt', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/octet-stream', 'content-length': String(2 ** 20) });
      later(res, () => res.end(Buffer.alloc(2 ** 20)));
    });
    const error = await failure(fakeClient(s.url, { maxAttempts: 3 }).get('/x', { parse: 'none' }));
    expect(error.code).toBe('attempts_exhausted');
    expect(s.log).toHaveLength(3);
    expect(s.connections()).toBeGreaterThanOrEqual(3);
  });

  it('a chunked body that runs past the cap is cancelled there', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/octet-stream' });
      // Chunked, 1 MiB in all: the drain stops past 64 KiB and gives the connection up.
      later(res, () => {
        for (let i = 0; i < 16; i++) res.write(Buffer.alloc(2 ** 16));
        res.end();
      });
    });
    const error = await failure(fakeClient(s.url, { maxAttempts: 3 }).get('/x', { parse: 'none' }));
    expect(error.code).toBe('attempts_exhausted');
    expect(s.log).toHaveLength(3);
    expect(s.connections()).toBeGreaterThanOrEqual(3);
  });

  it("a body that stalls does not hold the retry past an attempt's timeout", async () => {
    const s = await serve((_req, res, n) => {
      if (n === 1) {
        res.writeHead(503, { 'content-type': 'text/plain' });
        res.write('half'); // and never the rest
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
    });
    // The first answer's headers took all but 50 ms of a 60 s timeout on the injected clock: the
    // drain of its stalled body gets those 50 ms (a real timer), then the retry goes on. Each
    // attempt still has 60 s of real time, so a loaded machine cannot cut the second one off (a real
    // 50 ms timeout did, at load 10: a third request). A drain held by the stall, or given the whole
    // 60 s timeout, outlasts this test's 20 s.
    const time = fakeTime();
    let answers = 0;
    const client = createClient({
      baseUrl: s.url,
      now: time.now,
      retry: { baseDelay: '1ms', maxDelay: '1ms', jitter: 'none', timeout: '60s', deadline: false },
      fetch: async (input, init) => {
        const response = await fetch(input, init);
        answers += 1;
        if (answers === 1) time.advance(59_950);
        return response;
      },
    });
    const result = await client.get('/x', { parse: 'none' });
    expect(result.status).toBe(200);
    expect(await result.response.text()).toBe('ok');
    expect(s.log).toHaveLength(2);
  }, 20_000);

  it("the drain of a stalled body has only what is left of the attempt's timeout, so the retry horizon holds", async () => {
    const s = await serve((_req, res, n) => {
      if (n === 1) {
        res.writeHead(503, { 'content-type': 'text/plain' });
        res.write('half'); // and never the rest
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
    });
    // The headers took the whole 10 s timeout on the injected clock: nothing is left for the body,
    // which is given up at once (a drain of another 10 s would outlast this test).
    const time = fakeTime();
    const client = createClient({
      baseUrl: s.url,
      sleep: time.sleep,
      now: time.now,
      random: () => 0,
      fetch: async (input, init) => {
        const response = await fetch(input, init);
        time.advance(10_000);
        return response;
      },
    });
    const result = await client.get('/x', { parse: 'none' });
    expect(result.status).toBe(200);
    expect(s.log).toHaveLength(2);
  }, 5_000);
});

describe('QUERY (draft-ietf-httpbis-safe-method-w-body: safe and idempotent)', () => {
  it('Was wrong: got an Idempotency-Key; it gets none unless asked, and is sent upper-cased', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"hits":1}');
    });
    const client = createClient({ baseUrl: s.url });
    const result = await client.request('query', '/search', { body: { q: 'sku' } });
    expect(result.body).toEqual({ hits: 1 });
    expect(result.key).toBeUndefined();
    expect(s.log[0]?.method).toBe('QUERY');
    expect(s.log[0]?.headers['idempotency-key']).toBeUndefined();
    expect(s.log[0]?.text).toBe('{"q":"sku"}');

    await client.request('QUERY', '/search', { body: { q: 'sku' }, idempotencyKey: 'q-1' });
    expect(s.log[1]?.headers['idempotency-key']).toBe('"q-1"');
  });

  it('Was wrong: a 500 on an unkeyed QUERY was final; it is retried like a GET', async () => {
    const s = await serve((_req, res, n) => {
      res.writeHead(n === 1 ? 500 : 200, { 'content-type': 'application/json' });
      res.end('{}');
    });
    const time = fakeTime();
    const client = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random: () => 0 });
    // No key at all: the method alone makes the repeat harmless.
    const result = await client.request('QUERY', '/search', { body: { q: 'sku' }, idempotencyKey: false });
    expect(result.status).toBe(200);
    expect(s.log.map((seen) => seen.text)).toEqual(['{"q":"sku"}', '{"q":"sku"}']);
  });

  it('Was wrong: its redirects were not followed; a 307 keeps QUERY and its body, a 303 is fetched with GET', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/search') {
        res.writeHead(307, { location: '/v2/search' });
        res.end();
      } else if (req.url === '/v2/search') {
        res.writeHead(303, { location: '/results/42' });
        res.end();
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"hits":42}');
      }
    });
    const client = createClient({ baseUrl: s.url });
    const result = await client.request('QUERY', '/search', { body: { q: 'sku' } });
    expect(result.body).toEqual({ hits: 42 });
    expect(s.log.map((seen) => [seen.method, seen.url, seen.text])).toEqual([
      ['QUERY', '/search', '{"q":"sku"}'],
      ['QUERY', '/v2/search', '{"q":"sku"}'],
      ['GET', '/results/42', ''],
    ]);
  });

  it('Was wrong: in a browser (opaque redirects) it ended with redirect_unreadable; being safe, it is sent again for the browser to follow', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/search') {
        res.writeHead(307, { location: '/v2/search' });
        res.end();
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ method: req.method }));
      }
    });
    // What a browser's fetch does: 'manual' gives an opaqueredirect (status 0, no headers), 'follow' follows.
    const modes: (RequestRedirect | undefined)[] = [];
    const browserFetch = async (input: string, init: RequestInit) => {
      modes.push(init.redirect);
      const response = await fetch(input, init);
      if (init.redirect !== 'manual' || response.status < 300 || response.status > 399) return response;
      await response.body?.cancel();
      const opaque = new Response(null, { status: 200 });
      Object.defineProperty(opaque, 'type', { value: 'opaqueredirect' });
      Object.defineProperty(opaque, 'status', { value: 0 });
      return opaque;
    };
    const client = createClient({ baseUrl: s.url, fetch: browserFetch, retry: { maxAttempts: 1 } });
    const result = await client.request('QUERY', '/search', { body: { q: 'sku' } });
    expect(result.body).toEqual({ method: 'QUERY' });
    expect(modes).toEqual(['manual', 'follow']);
  });
});

describe('a 401 invalid_token is retried once with a refreshed token', () => {
  const challenge = 'Bearer realm="api", error="invalid_token", error_description="The access token expired"';

  function tokenSource() {
    const calls: Array<unknown> = [];
    let current = 'old';
    return {
      calls,
      getToken: (context?: { refresh: boolean }) => {
        calls.push(context);
        if (context?.refresh) current = 'new';
        return current;
      },
    };
  }

  it('Was wrong: a 401 was final; an unkeyed POST is sent again at once with getToken({ refresh: true })', async () => {
    const s = await serve((req, res) => {
      if (req.headers.authorization === 'Bearer new') {
        res.writeHead(201, { 'content-type': 'application/json' });
        res.end('{"id":"ch_1"}');
        return;
      }
      res.writeHead(401, { 'www-authenticate': challenge, 'content-type': 'application/problem+json' });
      res.end('{"status":401,"code":"token_expired","retryable":false}');
    });
    const time = fakeTime();
    const tokens = tokenSource();
    const client = createClient({ baseUrl: s.url, getToken: tokens.getToken, sleep: time.sleep, now: time.now });
    const result = await client.post('/charges', { amount: 500 }, { idempotencyKey: false });
    expect(result.status).toBe(201);
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual(['Bearer old', 'Bearer new']);
    expect(tokens.calls).toEqual([{ refresh: false }, { refresh: true }]);
    expect(result.attempts.map((a) => [a.status, a.waitMs])).toEqual([
      [401, 0],
      [201, undefined],
    ]);
    expect(time.waits).toEqual([0]); // no backoff: the old token was refused, not the load
  });

  it('once per call: a second 401 is final (http_error), and a keyed POST keeps its key', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(401, { 'www-authenticate': challenge });
      res.end();
    });
    let refresh = 0;
    const client = createClient({
      baseUrl: s.url,
      getToken: (context) => (context?.refresh ? `new-${++refresh}` : 'old'),
    });
    const error = await failure(client.post('/charges', { amount: 500 }));
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(401);
    expect(s.log).toHaveLength(2);
    expect(s.log[0]?.headers['idempotency-key']).toBe(s.log[1]?.headers['idempotency-key']);
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual(['Bearer old', 'Bearer new-1']);
  });

  it('not without the invalid_token challenge, not when getToken gives the same token again, not for an Authorization of the call', async () => {
    const s = await serve((req, res) => {
      res.writeHead(401, {
        'www-authenticate': req.url === '/plain' ? 'Bearer realm="api"' : challenge,
      });
      res.end();
    });
    const sameToken: Array<unknown> = [];
    const client = createClient({
      baseUrl: s.url,
      getToken: (context) => {
        sameToken.push(context);
        return 'same';
      },
    });
    expect((await failure(client.get('/plain'))).code).toBe('http_error');
    expect(s.log).toHaveLength(1);
    // A getToken that ignores the refresh gives the refused token back: sending it again is useless.
    expect((await failure(client.get('/expired'))).code).toBe('http_error');
    expect(s.log).toHaveLength(2);
    expect(sameToken).toEqual([{ refresh: false }, { refresh: false }, { refresh: true }]);
    // The caller's own Authorization is theirs: getToken is not asked.
    expect((await failure(client.get('/expired', { headers: { authorization: 'Bearer mine' } }))).code).toBe(
      'http_error',
    );
    expect(s.log).toHaveLength(3);
  });

  it('within maxAttempts (1: no refresh), and a refresh that throws ends the call with token_failed and the key', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(401, { 'www-authenticate': challenge });
      res.end();
    });
    const asked: Array<unknown> = [];
    const client = createClient({
      baseUrl: s.url,
      getToken: (context) => {
        asked.push(context);
        if (context.refresh) throw new Error('refresh token revoked');
        return 'old';
      },
    });
    const once = await failure(client.post('/charges', {}, { retry: { maxAttempts: 1 } }));
    expect(once.code).toBe('http_error');
    expect(asked).toEqual([{ refresh: false }]);
    const refused = await failure(client.post('/charges', {}, { idempotencyKey: 'op-1' }));
    expect(refused.code).toBe('token_failed');
    expect(refused.key).toBe('op-1');
    expect(refused.status).toBe(401);
    expect((refused.cause as Error).message).toBe('refresh token revoked');
    expect(s.log).toHaveLength(2);
  });
});

describe('bodies JSON would send as {}', () => {
  it.each([
    ['an Error', () => new Error('card declined'), /Error/],
    ['a Response', () => new Response('{"a":1}'), /Response/],
    ['a Request', () => new Request('http://127.0.0.1/'), /Request/],
  ])('Was wrong: %s was sent as {}; it is refused with a TypeError, nothing sent', async (_label, make, message) => {
    const s = await serve((_req, res) => {
      res.writeHead(201);
      res.end();
    });
    const client = createClient({ baseUrl: s.url });
    await expect(client.post('/x', make())).rejects.toThrow(TypeError);
    await expect(client.post('/x', make())).rejects.toThrow(message);
    expect(s.log).toHaveLength(0);
  });

  it('an Error with a toJSON is sent as that gives it', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(201);
      res.end();
    });
    const client = createClient({ baseUrl: s.url });
    const error = Object.assign(new Error('card declined'), { toJSON: () => ({ message: 'card declined' }) });
    await client.post('/x', error);
    expect(s.log[0]?.text).toBe('{"message":"card declined"}');
  });
});
