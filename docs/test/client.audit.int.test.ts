// Audit of docs/client.md and packages/client/README.md against @idem/client, and of the client
// half of the spec (parts 3.1 rule 3, 7 and 8), with real node:http servers on port 0 that answer
// as each scenario needs. Time and randomness are injected where the client takes them; the only
// real waits are a few hundred milliseconds of a timeout or deadline that runs on a real timer.
import { readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';
import { createClient, isRequestFailedError, type RequestFailedError } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { fakeTime } from '../../packages/client/test/support/fake-time.js';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

type Handler = (req: IncomingMessage, res: ServerResponse, seen: Seen, index: number) => void;

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

/** A real server on an ephemeral port that records each request (its body read whole) and hands it to `handler`. */
async function serve(handler: Handler): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const entry: Seen = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      };
      seen.push(entry);
      handler(req, res, entry, seen.length - 1);
    });
  });
  const { url, close } = await listen(server);
  closers.push(close);
  return { url, seen };
}

function answer(res: ServerResponse, status: number, body: unknown = {}, headers: Record<string, string> = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

const page = readFileSync(fileURLToPath(new URL('../client.md', import.meta.url)), 'utf8');

/** The row of docs/client.md's error table for `code`. */
function codeRow(code: string): string {
  const row = page.split('\n').find((line) => line.startsWith(`| \`${code}\` | `) && !line.includes("| `'"));
  if (row === undefined) throw new Error(`docs/client.md has no row for ${code}: revisit this audit`);
  return row;
}

/** The baseUrl row of docs/client.md's options table. */
function baseUrlRow(): string {
  const row = page.split('\n').find((line) => line.startsWith('| `baseUrl` |'));
  if (row === undefined) throw new Error('docs/client.md has no baseUrl row: revisit this audit');
  return row;
}

async function failure(promise: Promise<unknown>): Promise<RequestFailedError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isRequestFailedError(error)) throw new Error(`expected a RequestFailedError, got ${String(error)}`);
  return error;
}

describe('@idem/client against the spec (parts 3.1, 7, 8)', () => {
  // Spec part 8: "Key scope: per logical operation, not per attempt"; 3.1 / 2.1: a new key per retry is wrong.
  it('one key per logical operation, the same field and the same body bytes on every retry; the next call gets another', async () => {
    const s = await serve((req, res, _seen, i) => {
      if (i === 0) answer(res, 503);
      else if (i === 1) req.socket.destroy();
      else if (i === 2) answer(res, 409, { code: 'in_progress' });
      else answer(res, 201, { id: 'ch_1' });
    });
    const time = fakeTime();
    const api = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random: () => 0.5 });
    const result = await api.post('/charges', { amount: 500, note: 'é' });
    expect(result.status).toBe(201);
    expect(s.seen).toHaveLength(4);
    const fields = new Set(s.seen.map((r) => r.headers['idempotency-key']));
    const bodies = new Set(s.seen.map((r) => r.body));
    expect(fields.size).toBe(1);
    expect(bodies).toEqual(new Set([JSON.stringify({ amount: 500, note: 'é' })]));
    expect(s.seen[0]?.headers['idempotency-key']).toBe(`"${result.key}"`);
    expect(result.attempts.map((a) => a.key)).toEqual(Array(4).fill(result.key));

    const next = await api.post('/charges', { amount: 500, note: 'é' });
    expect(next.key).not.toBe(result.key);
    expect(s.seen[4]?.headers['idempotency-key']).toBe(`"${next.key}"`);
  });

  // Spec part 7: a 409 "The client treats it like a timeout: it backs off and retries later with the same key."
  it('a 409 is handled like a timed-out attempt: the same backoff wait, then the same key again', async () => {
    let hang = true;
    const s = await serve((req, res, _seen, i) => {
      if (req.url === '/timeout' && i === 0 && hang) return; // never answered: the attempt times out
      if (req.url === '/conflict' && i === 0) return answer(res, 409, { code: 'in_progress' });
      answer(res, 201, { id: 'ch_1' });
    });
    const runs: Array<{ waits: number[]; keys: unknown[]; outcomes: string[] }> = [];
    for (const path of ['/conflict', '/timeout']) {
      s.seen.length = 0;
      const time = fakeTime();
      const api = createClient({
        baseUrl: s.url,
        sleep: time.sleep,
        now: time.now,
        random: () => 0.5,
        retry: { timeout: 150 },
      });
      const result = await api.post(path, { amount: 1 });
      runs.push({
        waits: time.waits,
        keys: s.seen.map((r) => r.headers['idempotency-key']),
        outcomes: result.attempts.map((a) => a.outcome),
      });
      expect(new Set(s.seen.map((r) => r.headers['idempotency-key'])).size).toBe(1);
      expect(s.seen).toHaveLength(2);
    }
    hang = false;
    expect(runs.map((r) => r.outcomes)).toEqual([
      ['response', 'response'],
      ['timeout', 'response'],
    ]);
    // The same wait either way: half the first ceiling (1 s) with random() = 0.5.
    expect(runs.map((r) => r.waits)).toEqual([[500], [500]]);
  });

  // Spec part 8: "Exponential backoff with jitter (waits of 1 s, then 2 s, then 4 s, randomized)".
  it('backs off 1 s, 2 s, 4 s (the ceilings), randomized below them', async () => {
    const s = await serve((_req, res) => answer(res, 503));
    const waitsWith = async (random: () => number) => {
      const time = fakeTime();
      const api = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random, retry: { maxAttempts: 4 } });
      expect((await failure(api.post('/charges', {}))).code).toBe('attempts_exhausted');
      return time.waits;
    };
    expect(await waitsWith(() => 0.999_999)).toEqual([1000, 2000, 4000]);
    expect(await waitsWith(() => 0.25)).toEqual([250, 500, 1000]);
    const draws = [0.9, 0.1, 0.6];
    expect(await waitsWith(() => draws.shift() ?? 0)).toEqual([900, 200, 2400]);
  });

  // Spec 3.1 rule 3: "A key may be minted by the server ... The client attaches it to any retries."
  it('attaches a server-minted key, byte for byte, to every later attempt of the operation', async () => {
    const minted = '"srv-7f3a";v=1';
    const s = await serve((_req, res, _seen, i) => {
      if (i < 2) answer(res, 503, {}, { 'idempotency-key': minted });
      else answer(res, 201, { id: 'ch_9' }, { 'idempotency-key': minted });
    });
    const time = fakeTime();
    const api = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random: () => 0 });
    const result = await api.post('/charges', { amount: 9 }, { idempotencyKey: false });
    expect(s.seen.map((r) => r.headers['idempotency-key'])).toEqual([undefined, minted, minted]);
    expect(result.key).toBe('srv-7f3a');
    expect(result.attempts.map((a) => a.key)).toEqual([undefined, 'srv-7f3a', 'srv-7f3a']);
  });
});

describe('docs/client.md: defects found by this audit', () => {
  // Was wrong: readCapped refused a declared Content-Length over maxResponseBytes unread, on any
  // response. A HEAD (RFC 9110 9.3.2) and a 304 (15.4.5) carry the Content-Length of the
  // representation and no body at all, so asking the size of a file over 16 MiB, or revalidating it
  // with If-None-Match, ended with response_too_large.
  it('a HEAD or a 304 that declares a length over maxResponseBytes has no body, and resolves', async () => {
    const big = String(20 * 2 ** 20);
    const s = await serve((req, res) => {
      if (req.headers['if-none-match'] === '"v1"') res.writeHead(304, { etag: '"v1"', 'content-length': big });
      else res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': big });
      res.end();
    });
    const api = createClient({ baseUrl: s.url });
    const head = await api.request('HEAD', '/files/big.iso');
    expect(head.status).toBe(200);
    expect(head.headers.get('content-length')).toBe(big);
    expect(head.body).toBeUndefined();
    const cached = await api.get('/files/big.iso', { headers: { 'if-none-match': '"v1"' } });
    expect(cached.status).toBe(304);
    expect(cached.body).toBeUndefined();
    // A small limit changes nothing either: there is no body to hold.
    expect((await api.request('HEAD', '/files/big.iso', { maxResponseBytes: 1 })).status).toBe(200);
  });

  // docs/client.md, error codes, said: "`deadline_exceeded` | the deadline ran out (before a wait, or
  // in the middle of the last attempt)". Was wrong for an unkeyed write: its attempt cut short by the
  // deadline ends with `timeout`, and must, since docs/errors.md answers deadline_exceeded with "retry
  // later with the same error.key", and an unkeyed POST has none (a new call would be a new
  // operation). The code is kept; the page now says which of the two an attempt cut by the deadline gets.
  it('an attempt cut by the deadline: deadline_exceeded where a repeat was safe, timeout for an unkeyed write', async () => {
    const s = await serve(() => undefined); // never answers
    const api = createClient({ baseUrl: s.url, retry: { deadline: 150 } });
    const outcomes: Array<[string, string | undefined]> = [];
    for (const call of [
      () => api.post('/charges', {}, { idempotencyKey: false }),
      () => api.post('/charges', {}),
      () => api.get('/charges/1'),
    ]) {
      const error = await failure(call());
      outcomes.push([error.code, error.key === undefined ? undefined : 'key']);
      expect(error.attempts.map((a) => a.outcome)).toEqual(['timeout']);
    }
    expect(outcomes).toEqual([
      ['timeout', undefined],
      ['deadline_exceeded', 'key'],
      ['deadline_exceeded', undefined],
    ]);
    expect(codeRow('timeout')).toMatch(/the deadline cut it short/);
    expect(codeRow('deadline_exceeded')).toMatch(/could have been repeated/);
  });

  // Was wrong: a baseUrl with credentials (`http://user:pw@host`) was accepted and its credentials
  // dropped without a word (the normalized URL keeps only origin and path), so the requests went
  // without the Basic credentials the caller wrote. fetch refuses such a URL; the client now does too,
  // at construction, like every other bad option.
  it('a baseUrl with credentials is refused with a TypeError, not stripped silently', () => {
    expect(() => createClient({ baseUrl: 'http://user:pw@127.0.0.1:1/v1' })).toThrow(TypeError);
    expect(() => createClient({ baseUrl: 'http://user@127.0.0.1:1/v1' })).toThrow(/credentials/);
    expect(baseUrlRow()).toMatch(/credentials/);
  });

  // Was wrong: a getToken that gave something other than a string, null or undefined (an object
  // from a token endpoint, `{ access_token }`, passed on unread) sent the request with no
  // Authorization at all, and the caller saw only a 401. It is getToken failing, like a token a
  // header cannot carry: token_failed, nothing sent.
  it('a getToken that gives neither a string nor nothing ends with token_failed before anything is sent', async () => {
    const s = await serve((_req, res) => answer(res, 200));
    const api = createClient({
      baseUrl: s.url,
      getToken: (() => ({ access_token: 't' })) as unknown as () => string,
    });
    const error = await failure(api.post('/charges', {}));
    expect(error.code).toBe('token_failed');
    expect(error.cause).toBeInstanceOf(TypeError);
    expect(error.key).toBeDefined();
    expect(s.seen).toHaveLength(0);
  });

  // Was wrong: a request's own Authorization header was overwritten by getToken's bearer, silently,
  // though "a request's own headers win" is the rule for every other header (a token-exchange call
  // with Basic credentials, or one call made for another user, went with the session's token).
  // Decided: the request's own Authorization wins, and getToken is not called for that request.
  it("a request's own Authorization header wins over getToken, which is not called for it", async () => {
    const s = await serve((_req, res) => answer(res, 200));
    let calls = 0;
    const api = createClient({
      baseUrl: s.url,
      getToken: () => {
        calls++;
        return 'session-token';
      },
    });
    await api.post('/oauth/token', { grant_type: 'x' }, { headers: { Authorization: 'Basic Y2xpZW50OnNlY3JldA==' } });
    expect(s.seen[0]?.headers.authorization).toBe('Basic Y2xpZW50OnNlY3JldA==');
    expect(calls).toBe(0);
    // Any other request still gets the session's token.
    await api.get('/photos');
    expect(s.seen[1]?.headers.authorization).toBe('Bearer session-token');
    expect(calls).toBe(1);
  });
});

describe('docs/client.md: claims no other test pins', () => {
  // Options table: "`headers` | headers sent with every request; a request's own `headers` win."
  it("a request's own headers win over the client's, in any spelling, and the others still go", async () => {
    const s = await serve((_req, res) => answer(res, 200));
    const api = createClient({ baseUrl: s.url, headers: { 'X-Tenant': 'acme', 'X-Client': 'web' } });
    await api.get('/stock', { headers: { 'x-tenant': 'globex' } });
    expect(s.seen[0]?.headers['x-tenant']).toBe('globex');
    expect(s.seen[0]?.headers['x-client']).toBe('web');
  });

  // "`request(method, path, options)` works for any method: POST, PATCH and other non-idempotent
  // methods get a key the way `post` does."
  it('request() gives another non-idempotent method a key, kept on its retry; idempotent ones get none', async () => {
    const s = await serve((req, res, _seen, i) => {
      if (req.method === 'LOCK' && i === 0) return answer(res, 503);
      answer(res, 200);
    });
    const time = fakeTime();
    const api = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random: () => 0 });
    const locked = await api.request('LOCK', '/docs/7', { body: { owner: 'me' } });
    expect(locked.attempts).toHaveLength(2);
    expect(s.seen.map((r) => r.headers['idempotency-key'])).toEqual([`"${locked.key}"`, `"${locked.key}"`]);
    await api.request('OPTIONS', '/docs/7');
    await api.request('HEAD', '/docs/7');
    await api.request('PUT', '/docs/7', { body: {} });
    expect(s.seen.slice(2).map((r) => [r.method, r.headers['idempotency-key']])).toEqual([
      ['OPTIONS', undefined],
      ['HEAD', undefined],
      ['PUT', undefined],
    ]);
  });

  // "A 412 Precondition Failed is not retried. It means that someone else changed the value".
  it('a 412 on a conditional PUT is final at once: http_error, one request', async () => {
    const s = await serve((_req, res) => answer(res, 412, { title: 'Precondition Failed' }));
    const api = createClient({ baseUrl: s.url, sleep: () => Promise.reject(new Error('no wait expected')) });
    const error = await failure(
      api.put('/accounts/acc_1/balance', { balance: 105 }, { headers: { 'If-Match': '"7"' } }),
    );
    expect([error.code, error.status, s.seen.length]).toEqual(['http_error', 412, 1]);
    expect(s.seen[0]?.headers['if-match']).toBe('"7"');
  });

  // "Reads follow redirects as `fetch` does (up to 20 hops ...)".
  it('a read follows 20 redirects; a 21st is not followed', async () => {
    const s = await serve((req, res) => {
      const hop = Number(new URL(req.url ?? '/', 'http://x').searchParams.get('hop') ?? '0');
      const limit = req.url?.startsWith('/twentyone') ? 21 : 20;
      if (hop < limit) {
        res.writeHead(302, { location: `${req.url?.split('?')[0]}?hop=${hop + 1}` });
        res.end();
      } else answer(res, 200, { hop });
    });
    const api = createClient({ baseUrl: s.url, retry: { maxAttempts: 1 } });
    const twenty = await api.get<{ hop: number }>('/twenty');
    expect(twenty.body.hop).toBe(20);
    expect(twenty.response.redirected).toBe(true);
    const before = s.seen.length;
    const error = await failure(api.get('/twentyone'));
    expect([error.code, error.status]).toEqual(['http_error', 302]);
    expect(String((error.cause as Error).message)).toMatch(/redirect count exceeded/);
    expect(s.seen.length - before).toBe(21); // the first request and 20 hops: the 21st Location is not asked
  });

  // "Headers passed with the call go on, unless the client's `headers` has one of the same name."
  it("on a hop to another origin, a call's header goes on unless the client's headers name it too", async () => {
    const away = await serve((_req, res) => answer(res, 200));
    const home = await serve((_req, res) => {
      res.writeHead(302, { location: `${away.url}/landed` });
      res.end();
    });
    const api = createClient({ baseUrl: home.url, headers: { 'X-Api-Key': 'client-key' } });
    await api.get('/moved', { headers: { 'X-Api-Key': 'call-key', 'X-Trace': 't1' } });
    expect(home.seen[0]?.headers['x-api-key']).toBe('call-key');
    expect(away.seen[0]?.headers['x-api-key']).toBeUndefined();
    expect(away.seen[0]?.headers['x-trace']).toBe('t1');
  });

  // Waits: "Retry-After ... is a floor ... A key that stays in progress is therefore polled less and less often."
  it('a key that stays in progress behind a constant Retry-After is asked less and less often', async () => {
    const s = await serve((_req, res) => answer(res, 409, { code: 'in_progress' }, { 'retry-after': '1' }));
    const time = fakeTime();
    const api = createClient({ baseUrl: s.url, sleep: time.sleep, now: time.now, random: () => 0.999_999 });
    const error = await failure(api.post('/charges', {}));
    expect(error.code).toBe('attempts_exhausted');
    expect(time.waits).toEqual([1000, 2000, 4000, 8000]);
    expect(new Set(s.seen.map((r) => r.headers['idempotency-key'])).size).toBe(1);
  });

  // parse: 'none' leaves the body to the caller, and the per-attempt timeout ends with the headers
  // (ParseMode's TSDoc). docs/client.md's Waits table said only "`timeout` | one attempt, body
  // included": a reader setting a timeout to bound a download read with parse: 'none' was not told
  // that the body is outside it.
  it("with parse: 'none' the timeout covers the attempt up to the headers: a slow body is the caller's to read", async () => {
    const s = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first ');
      setTimeout(() => res.end('last'), 300);
    });
    const api = createClient({ baseUrl: s.url, retry: { timeout: 100 } });
    const result = await api.get('/report', { parse: 'none' });
    expect(await result.response.text()).toBe('first last');
    const error = await failure(api.get('/report', { parse: 'text', retry: { maxAttempts: 1 } }));
    expect(error.attempts[0]?.outcome).toBe('timeout');
    const row = page.split('\n').find((line) => line.startsWith("| `timeout` | `'10s'` |"));
    expect(row).toMatch(/with `parse: 'none'`, up to the headers/);
  });

  // Waits: "`signal` cancels everything at once: ... and, with `parse: 'none'`, the body you read
  // afterwards (that read rejects with the signal's reason)".
  it("with parse: 'none', a body read the signal cuts rejects with the signal's own reason", async () => {
    const s = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '100' });
      res.write('partial');
    });
    const controller = new AbortController();
    const result = await createClient({ baseUrl: s.url }).get('/r', { parse: 'none', signal: controller.signal });
    const reason = new Error('user left');
    const read = result.response.text().then(
      () => 'read',
      (error: unknown) => error,
    );
    controller.abort(reason);
    expect(await read).toBe(reason);
  });
});
