// Audit of the client following a read's redirects itself (redirects.ts), against real node:http and
// raw TCP servers on ephemeral ports: two ports are two origins. Compared with WHATWG fetch's
// "HTTP-redirect fetch" as undici implements it. Plain tests pin what held; "Was wrong" tests state
// the behaviour expected of a defect found (fixed since, or kept as it.fails until a decision).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createServer as createTcpServer, type Server as TcpServer } from 'node:net';
import { type ClientOptions, createClient } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

async function serve(handler: (req: IncomingMessage, res: ServerResponse, seen: Seen) => void) {
  const log: Seen[] = [];
  let connections = 0;
  const server: Server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const seen = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks) };
    log.push(seen);
    handler(req, res, seen);
  });
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(
    () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  );
  return { base: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, log, connections: () => connections };
}

const redirect = (res: ServerResponse, status: number, location: string, body = '') => {
  res.writeHead(status, { location, 'content-length': Buffer.byteLength(body) });
  res.end(body);
};

describe('a read follows its redirects as fetch does', () => {
  // Was wrong: a Location holding raw UTF-8 bytes (some servers and frameworks send it unencoded)
  // reaches Headers as one Latin-1 character per byte; resolved as it is, /café became
  // /caf%C3%83%C2%A9, a 404. undici (and browsers) read such a Location as UTF-8, and
  // redirect: 'follow' went to /caf%C3%A9; the client now does the same.
  it('reads a Location sent as raw UTF-8 bytes as UTF-8, as fetch does', async () => {
    const requested: string[] = [];
    const tcp: TcpServer = createTcpServer((socket) => {
      socket.on('data', (data) => {
        const target = data.toString('latin1').split(' ')[1] ?? '';
        requested.push(target);
        if (target === '/start') {
          socket.end(
            Buffer.concat([
              Buffer.from('HTTP/1.1 302 Found\r\nConnection: close\r\nContent-Length: 0\r\nLocation: /caf'),
              Buffer.from('é', 'utf8'),
              Buffer.from('\r\n\r\n'),
            ]),
          );
        } else {
          socket.end(`HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: ${target.length}\r\n\r\n${target}`);
        }
      });
    });
    await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
    closers.push(() => new Promise((resolve) => tcp.close(resolve)));
    const base = `http://127.0.0.1:${(tcp.address() as AddressInfo).port}`;
    const viaFetch = await fetch(`${base}/start`);
    expect(await viaFetch.text()).toBe('/caf%C3%A9');
    const client = createClient({ baseUrl: base, retry: { maxAttempts: 1 } });
    const result = await client.get('/start', { parse: 'text' });
    expect(result.body).toBe('/caf%C3%A9');
    expect(result.response.url).toBe(`${base}/caf%C3%A9`);
  });

  it("drops the client's headers and credentials on a real hop to another origin, keeps the call's", async () => {
    const other = await serve((_req, res) => res.end('there'));
    const api = await serve((req, res) => {
      if (req.url === '/same') redirect(res, 302, '/final');
      else if (req.url === '/away') redirect(res, 307, `${other.base}/landing?x=1`, 'moved');
      else res.end('here');
    });
    const client = createClient({
      baseUrl: api.base,
      headers: { 'x-api-key': 'sk_live_1' },
      getToken: () => 'tok',
      retry: { maxAttempts: 1 },
    });
    const same = await client.get('/same', { headers: { 'x-trace': 't1' }, parse: 'text' });
    expect(same.body).toBe('here');
    expect(api.log.map((s) => [s.url, s.headers['x-api-key'], s.headers.authorization, s.headers['x-trace']])).toEqual([
      ['/same', 'sk_live_1', 'Bearer tok', 't1'],
      ['/final', 'sk_live_1', 'Bearer tok', 't1'],
    ]);
    // An unkeyed PUT on 307 keeps its method, body and content type, without the credentials.
    const away = await client.put('/away', { a: 1 }, { headers: { 'x-trace': 't2' }, parse: 'text' });
    expect([away.body, away.response.url, away.response.redirected]).toEqual([
      'there',
      `${other.base}/landing?x=1`,
      true,
    ]);
    const [landed] = other.log;
    expect([
      landed?.method,
      landed?.body.toString(),
      landed?.headers['content-type'],
      landed?.headers['x-api-key'],
      landed?.headers.authorization,
      landed?.headers['x-trace'],
    ]).toEqual(['PUT', '{"a":1}', 'application/json', undefined, undefined, 't2']);
  });

  // Was wrong: a client-wide Content-Type (headers: { 'content-type': 'application/json' }, a common
  // setting, and then the client adds none of its own) was dropped with the client's other headers
  // on a 307 or 308 to another origin, while the body it describes went on: the other origin got a
  // JSON body without its type (and answered 415, or read it as text). It is not a credential; it now
  // goes with its body, and is dropped only when a 303 drops the body.
  it('keeps a client-wide Content-Type with the body it describes on a hop to another origin', async () => {
    const other = await serve((_req, res) => res.end());
    const api = await serve((req, res) => {
      if (req.url === '/away') redirect(res, 308, `${other.base}/landing`);
      else if (req.url === '/see') redirect(res, 303, `${other.base}/list`);
      else res.end();
    });
    const client = createClient({
      baseUrl: api.base,
      headers: { 'content-type': 'application/json', 'x-api-key': 'sk_live_1' },
      retry: { maxAttempts: 1 },
    });
    await client.put('/away', { a: 1 });
    await client.put('/see', { a: 1 });
    expect(
      other.log.map((s) => [s.method, s.url, s.body.toString(), s.headers['content-type'], s.headers['x-api-key']]),
    ).toEqual([
      ['PUT', '/landing', '{"a":1}', 'application/json', undefined],
      ['GET', '/list', '', undefined, undefined],
    ]);
  });

  it('resends the same bytes of a Blob, FormData, URLSearchParams or bytes body on 307 and 308', async () => {
    const api = await serve((req, res) => {
      if (req.url?.startsWith('/r')) redirect(res, req.url === '/r307' ? 307 : 308, '/done');
      else res.end();
    });
    const client = createClient({ baseUrl: api.base, retry: { maxAttempts: 1 } });
    const form = new FormData();
    form.append('name', 'ünï');
    form.append('file', new Blob(['file-bytes'], { type: 'text/plain' }), 'a.txt');
    const bodies: unknown[] = [
      new Blob(['blob-bytes'], { type: 'application/octet-stream' }),
      form,
      new URLSearchParams({ q: 'a b' }),
      new Uint8Array([1, 2, 3, 250]),
    ];
    for (const path of ['/r307', '/r308']) {
      for (const body of bodies) {
        api.log.length = 0;
        await client.put(path, body);
        const [first, second] = api.log;
        expect(second?.url).toBe('/done');
        expect(second?.method).toBe('PUT');
        expect(second?.body.equals(first?.body ?? Buffer.alloc(0))).toBe(true);
        expect(first?.body.length).toBeGreaterThan(0);
        expect(second?.headers['content-type']).toBe(first?.headers['content-type']);
      }
    }
  });

  it('keeps HEAD a HEAD through 301, 302 and 303, and turns an unkeyed DELETE into a GET on 303 only', async () => {
    const api = await serve((req, res) => {
      const status = Number(req.url?.slice(2));
      if (req.url?.startsWith('/r')) redirect(res, status, `/done${status}`);
      else res.end();
    });
    const client = createClient({ baseUrl: api.base, retry: { maxAttempts: 1 } });
    for (const status of [301, 302, 303, 307, 308]) await client.request('HEAD', `/r${status}`);
    for (const status of [301, 302, 303]) await client.delete(`/r${status}`);
    expect(api.log.filter((s) => s.url.startsWith('/done')).map((s) => `${s.method} ${s.url}`)).toEqual([
      'HEAD /done301',
      'HEAD /done302',
      'HEAD /done303',
      'HEAD /done307',
      'HEAD /done308',
      'DELETE /done301',
      'DELETE /done302',
      'GET /done303',
    ]);
  });

  it('does not read a redirect body: one larger than maxResponseBytes, or one that never ends, is skipped', async () => {
    const api = await serve((req, res) => {
      if (req.url === '/big') redirect(res, 302, '/ok', 'x'.repeat(64 * 1024));
      else if (req.url === '/endless') {
        res.writeHead(302, { location: '/ok' });
        const timer = setInterval(() => res.write('more '), 5);
        res.on('close', () => clearInterval(timer));
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      }
    });
    const client = createClient({
      baseUrl: api.base,
      maxResponseBytes: 1024,
      retry: { maxAttempts: 1, timeout: '10s' },
    });
    expect((await client.get('/big')).body).toEqual({ ok: true });
    expect((await client.get('/endless')).body).toEqual({ ok: true });
  });

  it("runs every hop under the attempt's timeout and the caller's signal", async () => {
    const api = await serve((req, res) => {
      if (req.url === '/r') redirect(res, 302, '/hang');
      // /hang never answers.
    });
    const client = createClient({ baseUrl: api.base, retry: { maxAttempts: 1, timeout: '300ms' } });
    // A read's timeout is retried, so with one attempt it ends as attempts_exhausted, by timeout.
    const timedOut = await failure(client.get('/r'));
    expect([timedOut.code, timedOut.attempts[0]?.outcome]).toEqual(['attempts_exhausted', 'timeout']);
    const controller = new AbortController();
    const slow = createClient({ baseUrl: api.base, retry: { maxAttempts: 1, timeout: '30s' } });
    const pending = failure(slow.get('/r', { signal: controller.signal }));
    const deadline = Date.now() + 10_000;
    while (api.log.filter((s) => s.url === '/hang').length < 2 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    controller.abort(new Error('caller gave up'));
    expect((await pending).code).toBe('aborted');
  });

  // Was wrong: the redirect's body is drained before the next hop, and a caller's abort during that
  // drain ended the drain but not the chain: under a fetch that ignores its signal (a wrapper that
  // drops it, a runtime's own), the next hop was still sent after the caller gave up.
  it("sends no further hop once the caller's signal aborted during a redirect body's drain", async () => {
    const api = await serve((req, res) => {
      if (req.url === '/stall') {
        // A body announced and never sent: the drain waits for it.
        res.writeHead(302, { location: '/next', 'content-length': '100' });
        res.write('x');
      } else res.end('{}');
    });
    const deaf: ClientOptions['fetch'] = (input, init) => fetch(input, { ...init, signal: null });
    const client = createClient({ baseUrl: api.base, fetch: deaf, retry: { maxAttempts: 1, timeout: '30s' } });
    const controller = new AbortController();
    const pending = failure(client.get('/stall', { signal: controller.signal }));
    const deadline = Date.now() + 10_000;
    while (!api.log.some((s) => s.url === '/stall') && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    controller.abort(new Error('caller gave up'));
    expect((await pending).code).toBe('aborted');
    // Past the drain's own bound (250 ms): had the chain gone on, /next would be in the log by now.
    await new Promise((resolve) => setTimeout(resolve, 400));
    expect(api.log.map((s) => s.url)).toEqual(['/stall']);
  });

  it('keeps the connection for the next hop: redirected reads do not open a socket per hop', async () => {
    const api = await serve((req, res) => {
      if (req.url === '/r') redirect(res, 302, '/ok', 'see /ok');
      else res.end('ok');
    });
    const client = createClient({ baseUrl: api.base, retry: { maxAttempts: 1 } });
    for (let n = 0; n < 10; n++) await client.get('/r');
    expect(api.log).toHaveLength(20);
    expect(api.connections()).toBeLessThanOrEqual(3);
  });

  it('tells origins apart as URLs do: case, default port and IDN are the same origin; //host and /\\host are not', async () => {
    const seen: [string, string | null][] = [];
    const hops: Record<string, string> = {
      'http://api.example.test/a': 'HTTP://API.EXAMPLE.TEST:80/b',
      'http://api.example.test/b': 'http://api.example.test/c',
      // Headers hold this ü as the one Latin-1 byte 0xFC, which is no UTF-8: read as the ü it is.
      'https://xn--bcher-kva.example.test/a': 'https://bücher.example.test:443/b',
      'http://api.example.test/d': '//evil.example.test/x',
      'http://api.example.test/e': '/\\evil.example.test/x',
      'http://api.example.test/f': 'https://api.example.test/f',
    };
    const fetch: ClientOptions['fetch'] = async (input, init) => {
      seen.push([input, new Headers(init.headers).get('x-api-key')]);
      const location = hops[input];
      return location === undefined
        ? new Response('{}', { headers: { 'content-type': 'application/json' } })
        : new Response(null, { status: 302, headers: { location } });
    };
    const options = { fetch, headers: { 'x-api-key': 'k' }, retry: { maxAttempts: 1 } };
    const plain = createClient({ baseUrl: 'http://api.example.test', ...options });
    const idn = createClient({ baseUrl: 'https://bücher.example.test', ...options });
    await plain.get('/a');
    await idn.get('/a');
    for (const path of ['/d', '/e', '/f']) await plain.get(path);
    expect(seen).toEqual([
      ['http://api.example.test/a', 'k'],
      ['http://api.example.test/b', 'k'],
      ['http://api.example.test/c', 'k'],
      ['https://xn--bcher-kva.example.test/a', 'k'],
      ['https://xn--bcher-kva.example.test/b', 'k'],
      ['http://api.example.test/d', 'k'],
      ['http://evil.example.test/x', null],
      ['http://api.example.test/e', 'k'],
      ['http://evil.example.test/x', null],
      // An upgrade to https is another origin too (fetch drops Authorization there as well).
      ['http://api.example.test/f', 'k'],
      ['https://api.example.test/f', null],
    ]);
  });

  // Was wrong: where redirects are opaque (a browser), a read that met one was sent again with
  // redirect: 'follow'. For GET and HEAD that is one more request and nothing else; an unkeyed PUT or
  // DELETE had already run, so the DELETE was executed twice and the second answered 404, an
  // http_error for a delete that worked. Decided: a runtime that hides redirects ends such a PUT or
  // DELETE with redirect_unreadable (it ran once), and every later read of the client is sent with
  // redirect: 'follow' for the browser to follow. (A guess from globals such as `document` was
  // tried and dropped: jsdom gives Node one; see browser-detection.audit.test.ts.)
  const deletedOnce = async () => {
    let deleted = 0;
    const api = await serve((req, res) => {
      if (req.method === 'DELETE' && req.url === '/items/1') {
        deleted++;
        if (deleted === 1) redirect(res, 303, '/items');
        else res.writeHead(404).end();
      } else res.writeHead(200, { 'content-type': 'application/json' }).end('[]');
    });
    // What a browser's fetch does: 'manual' gives an opaqueredirect (status 0, no headers), 'follow' follows.
    const modes: (RequestRedirect | undefined)[] = [];
    const browserFetch: ClientOptions['fetch'] = async (input, init) => {
      modes.push(init.redirect);
      const response = await fetch(input, init);
      if (init.redirect !== 'manual' || response.status < 300 || response.status > 399) return response;
      await response.body?.cancel();
      const opaque = new Response(null, { status: 200 });
      Object.defineProperty(opaque, 'type', { value: 'opaqueredirect' });
      Object.defineProperty(opaque, 'status', { value: 0 });
      return opaque;
    };
    const client = createClient({ baseUrl: api.base, fetch: browserFetch, retry: { maxAttempts: 1 } });
    return { client, modes, deleted: () => deleted };
  };

  it('where redirects turn out opaque, an unkeyed DELETE ends with redirect_unreadable (run once); later reads are followed', async () => {
    const { client, modes, deleted } = await deletedOnce();
    const error = await failure(client.delete('/items/1'));
    expect(error.code).toBe('redirect_unreadable');
    expect(deleted()).toBe(1);
    expect((await client.get('/items')).body).toEqual([]);
    expect(modes).toEqual(['manual', 'follow']);
  });
});
