// Fresh-eyes audit of 2026-12 (what a demanding user of a retrying client expects), against real
// node:http servers on ephemeral ports. Plain tests pin behaviour the audit checked and found right;
// those marked "Was wrong" state the correct behaviour of a defect the audit found, fixed since.
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createClient } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { fakeTime } from './support/fake-time.js';

interface Seen {
  method: string;
  headers: IncomingMessage['headers'];
  body: Buffer;
}

const servers: Server[] = [];

async function serve(handler: (req: IncomingMessage, res: ServerResponse, n: number) => void) {
  const log: Seen[] = [];
  let connections = 0;
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    log.push({ method: req.method ?? '', headers: req.headers, body: Buffer.concat(chunks) });
    handler(req, res, log.length);
  });
  server.on('connection', () => {
    connections++;
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  servers.push(server);
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, log, connections: () => connections };
}

afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(async (s) => {
      s.closeAllConnections();
      s.close();
      await once(s, 'close');
    }),
  );
});

/** Real server, fake clock; the jitter draws the middle of each window. */
function fakeClient(url: string) {
  const time = fakeTime();
  return { time, client: createClient({ baseUrl: url, random: () => 0.5, sleep: time.sleep, now: time.now }) };
}

describe('bodies whose JSON form drops what they hold', () => {
  // Was wrong: each went out as `{}` with Content-Type application/json, and a server that accepts an
  // empty object (every field optional, or defaults) ran the operation on nothing. A Promise is a
  // missing `await`; a Map, a Set or an iterator keeps its values where JSON.stringify does not look.
  // fetch would send "[object Promise]" or "[object Map]"; neither is what the caller meant.
  it.each([
    ['a Promise (a missing await)', () => Promise.resolve({ amount: 500 })],
    // biome-ignore lint/suspicious/noThenProperty: a thenable body is what the test sends
    ['a thenable', () => ({ then: (resolve: (v: unknown) => void) => resolve({ amount: 500 }) })],
    ['a Map', () => new Map([['amount', 500]])],
    ['a Set', () => new Set(['sku-1', 'sku-2'])],
    [
      'a generator',
      () =>
        (function* () {
          yield 'sku-1';
        })(),
    ],
    ['a Map iterator', () => new Map([['amount', 500]]).entries()],
  ])('refuses %s with a TypeError before anything is sent', async (_name, make) => {
    const s = await serve((_req, res) => {
      res.writeHead(201).end();
    });
    const { client } = fakeClient(s.url);
    await expect(client.post('/charges', make())).rejects.toThrow(TypeError);
    expect(s.log).toHaveLength(0);
  });

  it('still sends what JSON does carry: arrays, objects with toJSON, class instances, null', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(201).end();
    });
    const { client } = fakeClient(s.url);
    class Money {
      constructor(readonly amount: number) {}
    }
    const withToJson = Object.assign(new Map([['a', 1]]), { toJSON: () => ({ a: 1 }) });
    for (const body of [['sku-1'], withToJson, new Money(500), null, new Date(0)]) await client.post('/x', body);
    expect(s.log.map((seen) => seen.body.toString())).toEqual([
      '["sku-1"]',
      '{"a":1}',
      '{"amount":500}',
      'null',
      '"1970-01-01T00:00:00.000Z"',
    ]);
  });
});

describe('a read whose redirect cannot be followed', () => {
  // Was wrong: a GET into a redirect loop made 21 requests per attempt and was retried as a network
  // error, 105 requests and up to 15 s of backoff for an answer that never changes (writes were
  // fixed before: their 3xx is their answer). A Location that is no http(s) URL, or no URL at all,
  // was retried the same way. Each is the server's deterministic answer: http_error at once, with
  // that 3xx as the response, so its Location can be read (an app scheme such as myapp://).
  it('a loop: http_error after one attempt of 21 requests, the last 302 in the error', async () => {
    const s = await serve((_req, res) => {
      res.writeHead(302, { location: '/loop' }).end();
    });
    const error = await failure(fakeClient(s.url).client.get('/loop'));
    expect([error.code, error.status, error.attempts.length, s.log.length]).toEqual(['http_error', 302, 1, 21]);
    expect(error.cause).toBeInstanceOf(TypeError);
  });

  it.each([
    ['an app scheme', 'myapp://callback?code=1'],
    ['ftp', 'ftp://files.example.test/x'],
    ['no URL at all', 'http://[not-a-host'],
  ])('a Location of %s: http_error after one request, the Location readable', async (_name, location) => {
    const s = await serve((_req, res) => {
      res.writeHead(302, { location }).end();
    });
    const error = await failure(fakeClient(s.url).client.get('/authorize'));
    expect([error.code, error.status, s.log.length]).toEqual(['http_error', 302, 1]);
    expect(error.response?.headers.get('location')).toBe(location);
  });
});
