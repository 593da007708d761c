// Audit: real reverse proxies in front of idem, Debian's nginx 1.22 and HAProxy 2.6, each started
// from a config of its own (audit-support/real-proxies.ts), in front of Express, Fastify and Koa on
// the memory store and on Redis. What an operator configures in front of an API:
// - nginx's defaults (HTTP/1.0 to the upstream, so no chunked responses; response and request
//   buffering on), then HTTP/1.1 with keepalive upstreams: first answers and replays byte for byte;
// - proxy-side resends of a POST (nginx `proxy_next_upstream ... non_idempotent`, HAProxy
//   `retry-on` with `option redispatch`) after an origin died or was slow mid-request: one run, and
//   the client gets the in-flight 409 with Retry-After, then the replay; never a second run or a 500;
//   and a body too large for the proxy to keep, which it does not resend (502);
// - proxy timeouts (nginx `proxy_read_timeout`, HAProxy `timeout server`): 504, then 409, then the
//   handler's own answer replayed;
// - headers through the proxies, HAProxy `http-reuse always` sharing one origin connection between
//   users, an nginx `proxy_cache` on POST;
// - request bodies over `client_max_body_size`, slow uploads and uploads cut by the client behind
//   `proxy_request_buffering off`.
// The binaries must be installed: without them this file fails, it does not skip.
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { memoryStore, type Store } from '@idem/core';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import {
  type Answer,
  bigBody,
  type FrameworkName,
  frameworkNames,
  type Origin,
  post,
  type RealProxy,
  requireBinaries,
  type Shared,
  shared,
  startHaproxy,
  startNginx,
  startOrigin,
  streamChunks,
  until,
} from './audit-support/real-proxies.js';

requireBinaries();

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
// Asked first, as the README promises: without Redis its rows are skipped with a warning (a failure
// under CI=true), not failed on a refused connection.
const redisUp = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the proxies audit rows on the Redis store',
);
const prefix = `audit-proxies:${randomBytes(4).toString('hex')}:`;
let redis: Redis | undefined;
let stores = 0;

beforeAll(async () => {
  if (!redisUp) return;
  redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  await redis.ping();
});
afterAll(async () => {
  if (redis === undefined) return;
  await deleteKeys(redis, prefix);
  await redis.quit();
});

const backends: Record<string, () => Store> = {
  memory: () => memoryStore(),
  ...(redisUp ? { redis: () => redisStore({ client: redis as Redis, prefix: `${prefix}${++stores}:` }) } : {}),
};

const combos = frameworkNames.flatMap((framework) =>
  Object.keys(backends).map((backend) => ({ framework, backend, name: `${framework} on ${backend}` })),
);

// The proxies give up on a slow origin after this long. Long enough for a busy box to claim the key
// before it (an adapter whose client left while the claim waited releases it and runs nothing, and
// the resend would then run as the first attempt), and to answer the in-flight 409 after it.
const proxyTimeoutMs = 2_000;

/** Starts `count` origins on one store, a proxy in front of them, runs `body`, stops everything. */
async function withProxy(
  setup: { framework: FrameworkName; backend: string; origins?: number },
  proxy: (ports: number[]) => Promise<RealProxy>,
  body: (p: RealProxy, s: Shared) => Promise<void>,
): Promise<void> {
  const s = shared();
  const store = (backends[setup.backend] as () => Store)();
  const origins: Origin[] = [];
  let running: RealProxy | undefined;
  try {
    for (let i = 0; i < (setup.origins ?? 1); i++) origins.push(await startOrigin(setup.framework, store, s));
    running = await proxy(origins.map((o) => o.port));
    await body(running, s);
  } finally {
    s.slow.open();
    await running?.stop();
    for (const origin of origins) await origin.close();
  }
}

// `max_fails=0`: nginx would otherwise take an origin out for 10 s after one failure (the cut of
// the first scenario), and answer the next one `502 no live upstreams` instead of trying it.
const upstream = (ports: number[], extra = '') =>
  `upstream app { ${ports.map((port) => `server 127.0.0.1:${port} max_fails=0;`).join(' ')} ${extra} }`;

/** Resolves once the proxy's log shows `pattern`: a proxy logs a request after it answered it. */
async function logShows(proxy: RealProxy, pattern: RegExp): Promise<void> {
  await until(() => pattern.test(proxy.log()), 10_000).catch(() => {
    throw new Error(`the proxy's log never showed ${pattern}:\n${proxy.log()}`);
  });
}

/** The in-flight answer: 409, Retry-After, never cached. */
function expectInFlight(answer: Answer): void {
  expect(answer.status, `${answer.status} ${answer.error ?? ''} ${answer.body.toString().slice(0, 300)}`).toBe(409);
  expect(answer.headers['retry-after']).toMatch(/^\d+$/);
  expect(answer.headers['cache-control']).toBe('no-store');
  expect(JSON.parse(answer.body.toString()).code).toBe('in_progress');
}

/** The replay of run 1 of `route`: its status and bytes, marked, framed with a Content-Length. */
function expectReplay(answer: Answer, route: string, key: string): void {
  expect(answer.status, `${answer.status} ${answer.error ?? ''} ${answer.body.toString().slice(0, 300)}`).toBe(201);
  expect(answer.headers['idempotent-replayed']).toBe('true');
  expect(answer.headers['cache-control']).toBe('no-store');
  expect(answer.headers['idempotency-key']).toBe(key);
  expect(JSON.parse(answer.body.toString())).toMatchObject({ id: `${route}_1`, user: 'alice' });
}

/** What `route` answers on its first run, as bytes. */
const expectedBody = (route: string, first: Answer) =>
  route === 'stream' ? Buffer.from(streamChunks.join('')) : route === 'big' ? bigBody : first.body;

// Concurrent: each test has its own origins, store and proxy, and most of their time is spent waiting
// for a proxy to give up; side by side the file stays under half a minute.
describe.concurrent.each(combos)('real proxies in front of $name', ({ framework, backend }) => {
  it.each([
    ['HTTP/1.0 to the origin (nginx default, buffered)', ''],
    ['HTTP/1.1 with keepalive upstreams', 'proxy_http_version 1.1; proxy_set_header Connection "";'],
  ])(
    'nginx, %s: first answers and replays of JSON, chunk-by-chunk and 512 KiB bodies match byte for byte, one run each',
    async (_name, directives) => {
      await withProxy(
        { framework, backend },
        (ports) =>
          startNginx({
            http: upstream(ports, 'keepalive 4;'),
            server: `location / { proxy_pass http://app; ${directives} }`,
          }),
        async (nginx, s) => {
          for (const route of ['charges', 'stream', 'big']) {
            const key = `bytes-${route}`;
            const first = await post(`${nginx.url}/${route}`, key);
            expect(first.status).toBe(route === 'big' ? 200 : 201);
            expect(first.headers['idempotency-key']).toBe(key);
            expect(first.body.equals(expectedBody(route, first))).toBe(true);
            const replay = await post(`${nginx.url}/${route}`, key);
            expect(replay.status).toBe(first.status);
            expect(replay.headers['idempotent-replayed']).toBe('true');
            expect(replay.headers['cache-control']).toBe('no-store');
            expect(replay.headers['content-type']).toBe(first.headers['content-type']);
            expect(replay.headers['content-length']).toBe(String(first.body.length));
            expect(replay.headers['transfer-encoding']).toBeUndefined();
            expect(replay.body.equals(first.body)).toBe(true);
            expect(s.runs[route]).toBe(1);
          }
        },
      );
    },
  );

  it('nginx `proxy_next_upstream error timeout non_idempotent` resends the POST after the first origin died mid-request or timed out: the second origin answers 409, one run, then the replay', async () => {
    await withProxy(
      { framework, backend, origins: 2 },
      (ports) =>
        startNginx({
          http: upstream(ports),
          server: `location / { proxy_pass http://app; proxy_read_timeout ${proxyTimeoutMs}ms; proxy_next_upstream error timeout non_idempotent; }`,
        }),
      async (nginx, s) => {
        for (const route of ['crash', 'slow']) {
          const first = await post(`${nginx.url}/${route}`, `next-${route}`);
          // nginx did resend it: two upstreams in its log, the first one's failure then idem's 409.
          await logShows(
            nginx,
            new RegExp(
              `POST /${route} 409 upstream=\\[[^,]+, [^\\]]+\\] statuses=\\[${route === 'crash' ? 502 : 504}, 409\\]`,
            ),
          );
          expectInFlight(first);
          expect(s.runs[route]).toBe(1);
        }
        s.slow.open();
        await until(() => s.finished.crash === 1 && s.finished.slow === 1);
        for (const route of ['crash', 'slow']) {
          expectReplay(await post(`${nginx.url}/${route}`, `next-${route}`), route, `next-${route}`);
          expect(s.runs[route]).toBe(1);
        }
      },
    );
  });

  it('nginx without `non_idempotent` never resends a POST: the client gets the 502 and its retry the replay', async () => {
    await withProxy(
      { framework, backend, origins: 2 },
      (ports) =>
        startNginx({
          http: upstream(ports),
          server: 'location / { proxy_pass http://app; proxy_next_upstream error timeout; }',
        }),
      async (nginx, s) => {
        const first = await post(`${nginx.url}/crash`, 'no-resend');
        expect(first.status).toBe(502);
        await logShows(nginx, /POST \/crash 502 upstream=\[[^,\]]+\] statuses=\[502\]/);
        s.slow.open();
        await until(() => s.finished.crash === 1);
        expectReplay(await post(`${nginx.url}/crash`, 'no-resend'), 'crash', 'no-resend');
        expect(s.runs.crash).toBe(1);
      },
    );
  });

  it('HAProxy `retry-on all-retryable-errors` with `option redispatch` resends the POST to the other origin after a cut or a response timeout: 409, one run, then the replay', async () => {
    await withProxy(
      { framework, backend, origins: 2 },
      ([a, b]) =>
        startHaproxy({
          backend: [
            'balance first',
            'retries 2',
            'option redispatch 1',
            'retry-on all-retryable-errors',
            `timeout server ${proxyTimeoutMs}`,
            `server a 127.0.0.1:${a}`,
            `server b 127.0.0.1:${b}`,
          ].join('\n  '),
        }),
      async (haproxy, s) => {
        for (const route of ['crash', 'slow']) {
          const first = await post(`${haproxy.url}/${route}`, `retry-on-${route}`);
          // Served by the second server after one redispatched retry ("+1" in the retries field).
          await logShows(haproxy, new RegExp(`be/b .* 409 .*/\\+1 .*"POST /${route} HTTP/1.1"`));
          expectInFlight(first);
          expect(s.runs[route]).toBe(1);
        }
        s.slow.open();
        await until(() => s.finished.crash === 1 && s.finished.slow === 1);
        for (const route of ['crash', 'slow']) {
          expectReplay(await post(`${haproxy.url}/${route}`, `retry-on-${route}`), route, `retry-on-${route}`);
          expect(s.runs[route]).toBe(1);
        }
      },
    );
  });

  it.each([
    [
      'HAProxy (a body over its 16 KiB buffer)',
      ([a, b]: number[]) =>
        startHaproxy({
          backend: `balance first\n  retries 2\n  option redispatch 1\n  retry-on all-retryable-errors\n  server a 127.0.0.1:${a}\n  server b 127.0.0.1:${b}`,
        }),
    ],
    [
      'nginx with `proxy_request_buffering off`',
      (ports: number[]) =>
        startNginx({
          http: upstream(ports),
          server:
            'location / { proxy_pass http://app; proxy_http_version 1.1; proxy_request_buffering off; proxy_next_upstream error timeout non_idempotent; }',
        }),
    ],
  ])(
    '%s cannot resend a body it did not keep: the client gets 502 despite the retry settings, its retry the replay',
    async (_name, proxy) => {
      await withProxy({ framework, backend, origins: 2 }, proxy, async (p, s) => {
        const big = { body: Buffer.alloc(200_000, 97), headers: { 'content-type': 'application/octet-stream' } };
        expect((await post(`${p.url}/crash`, 'kept-no-body', big)).status).toBe(502);
        expect(s.runs.crash).toBe(1);
        s.slow.open();
        await until(() => s.finished.crash === 1);
        const retry = await post(`${p.url}/crash`, 'kept-no-body', big);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(s.runs.crash).toBe(1);
      });
    },
  );

  it('HAProxy `retry-on response-timeout` on one origin resends the POST to the same origin: 409, one run', async () => {
    await withProxy(
      { framework, backend },
      ([a]) =>
        startHaproxy({
          backend: `retries 2\n  retry-on response-timeout\n  timeout server ${proxyTimeoutMs}\n  server a 127.0.0.1:${a}`,
        }),
      async (haproxy, s) => {
        expectInFlight(await post(`${haproxy.url}/slow`, 'same-origin'));
        expect(s.runs.slow).toBe(1);
        s.slow.open();
        await until(() => s.finished.slow === 1);
        expectReplay(await post(`${haproxy.url}/slow`, 'same-origin'), 'slow', 'same-origin');
        expect(s.runs.slow).toBe(1);
      },
    );
  });

  it.each([
    [
      'nginx `proxy_read_timeout`',
      (ports: number[]) =>
        startNginx({
          http: upstream(ports),
          server: `location / { proxy_pass http://app; proxy_read_timeout ${proxyTimeoutMs}ms; }`,
        }),
    ],
    [
      'HAProxy `timeout server`',
      ([a]: number[]) => startHaproxy({ backend: `timeout server ${proxyTimeoutMs}\n  server a 127.0.0.1:${a}` }),
    ],
  ])(
    '%s expires while the handler runs: 504, the retry 409, then the handler’s own answer replayed, one run',
    async (_name, proxy) => {
      await withProxy({ framework, backend }, proxy, async (p, s) => {
        expect((await post(`${p.url}/slow`, 'timeout')).status).toBe(504);
        expectInFlight(await post(`${p.url}/slow`, 'timeout'));
        s.slow.open();
        await until(() => s.finished.slow === 1);
        expectReplay(await post(`${p.url}/slow`, 'timeout'), 'slow', 'timeout');
        expect(s.runs.slow).toBe(1);
      });
    },
  );

  it('a client that gives up behind nginx (499, nginx closes its origin connection) leaves the run going: its retry gets 409, then the replay, one run', async () => {
    await withProxy(
      { framework, backend },
      ([a]) => startNginx({ server: `location / { proxy_pass http://127.0.0.1:${a}; }` }),
      async (nginx, s) => {
        const gone = new AbortController();
        const request = fetch(`${nginx.url}/slow`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': 'gave-up', 'x-user': 'alice' },
          body: JSON.stringify({ amount: 100 }),
          signal: gone.signal,
        }).catch(() => undefined);
        await until(() => s.runs.slow === 1);
        gone.abort();
        await request;
        await logShows(nginx, /POST \/slow 499 .*key=gave-up/);
        expectInFlight(await post(`${nginx.url}/slow`, 'gave-up'));
        s.slow.open();
        await until(() => s.finished.slow === 1);
        expectReplay(await post(`${nginx.url}/slow`, 'gave-up'), 'slow', 'gave-up');
        expect(s.runs.slow).toBe(1);
      },
    );
  });

  it('HAProxy `http-reuse always` shares origin connections between users: the same key from two users runs twice, each replayed only their own', async () => {
    await withProxy(
      { framework, backend },
      ([a]) => startHaproxy({ backend: `http-reuse always\n  server a 127.0.0.1:${a}` }),
      async (haproxy, s) => {
        const agents = [
          new http.Agent({ keepAlive: true, maxSockets: 1 }),
          new http.Agent({ keepAlive: true, maxSockets: 1 }),
        ];
        try {
          const send = (user: string, agent: http.Agent) =>
            post(`${haproxy.url}/charges`, 'shared-key', { user, agent });
          const [alice1, bob1] = await Promise.all([
            send('alice', agents[0] as http.Agent),
            send('bob', agents[1] as http.Agent),
          ]);
          const [alice2, bob2] = await Promise.all([
            send('alice', agents[0] as http.Agent),
            send('bob', agents[1] as http.Agent),
          ]);
          expect(s.runs.charges).toBe(2);
          for (const [first, replay, user] of [
            [alice1, alice2, 'alice'],
            [bob1, bob2, 'bob'],
          ] as const) {
            expect(JSON.parse(first.body.toString()).user).toBe(user);
            expect(replay.headers['idempotent-replayed']).toBe('true');
            expect(replay.body.equals(first.body)).toBe(true);
          }
        } finally {
          for (const agent of agents) agent.destroy();
        }
      },
    );
  });
});

/** Sends a request head, then `parts` of its body one by one, then ends or cuts the connection. */
function upload(port: number, head: string, parts: Buffer[], end: 'cut' | 'finish'): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let answer = '';
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1');
    });
    socket.on('close', () => resolve(answer));
    socket.on('error', () => undefined);
    socket.once('connect', async () => {
      socket.write(head);
      for (const part of parts) {
        // A slow client: each part after the origin had time to start reading the one before.
        await new Promise((r) => setTimeout(r, 50));
        socket.write(part);
      }
      if (end === 'cut') socket.destroy();
    });
  });
}

const uploadHead = (key: string, framing: string) =>
  `POST /upload HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/octet-stream\r\n${framing}\r\nIdempotency-Key: ${key}\r\nX-User: alice\r\nConnection: close\r\n\r\n`;

describe.each(frameworkNames)('request bodies through nginx in front of %s', (framework) => {
  it('a body over `client_max_body_size` is refused 413 by nginx; idem never claims its key', async () => {
    await withProxy(
      { framework, backend: 'memory' },
      ([a]) => startNginx({ server: `client_max_body_size 64k; location / { proxy_pass http://127.0.0.1:${a}; }` }),
      async (nginx, s) => {
        const binary = { 'content-type': 'application/octet-stream' };
        const refused = await post(`${nginx.url}/upload`, 'too-big', {
          body: Buffer.alloc(100_000, 97),
          headers: binary,
        });
        expect(refused.status).toBe(413);
        expect(s.events).toEqual([]);
        const small = await post(`${nginx.url}/upload`, 'too-big', { body: Buffer.alloc(1_000, 97), headers: binary });
        expect(small.status).toBe(201);
        expect(small.headers['idempotent-replayed']).toBeUndefined();
      },
    );
  });

  it('with `proxy_request_buffering off`, a slow upload reaches the handler whole, and an upload the client cuts (Content-Length or chunked) claims nothing: its retry runs once', async () => {
    await withProxy(
      { framework, backend: 'memory' },
      ([a]) =>
        startNginx({
          server: `location / { proxy_pass http://127.0.0.1:${a}; proxy_http_version 1.1; proxy_request_buffering off; }`,
        }),
      async (nginx, s) => {
        const part = Buffer.alloc(16_384, 97);
        const slow = await upload(
          nginx.port,
          uploadHead('slow-upload', 'Content-Length: 49152'),
          [part, part, part],
          'finish',
        );
        expect(slow).toMatch(/^HTTP\/1.1 201/);
        expect(slow).toContain('"bytes":49152');
        // Chunked: nginx forwards it chunked too (HTTP/1.1 to the origin, no buffering).
        const chunk = Buffer.from(`4000\r\n${part.toString()}\r\n`);
        const slowChunked = await upload(
          nginx.port,
          uploadHead('slow-chunked', 'Transfer-Encoding: chunked'),
          [chunk, chunk, chunk, Buffer.from('0\r\n\r\n')],
          'finish',
        );
        expect(slowChunked).toMatch(/^HTTP\/1.1 201/);
        expect(slowChunked).toContain('"bytes":49152');
        expect(s.runs.upload).toBe(2);

        const cuts = [
          ['cut-length', 'Content-Length: 49152', [part, part]],
          ['cut-chunked', 'Transfer-Encoding: chunked', [chunk]],
        ] as const;
        for (const [key, framing, parts] of cuts) {
          await upload(nginx.port, uploadHead(key, framing), [...parts], 'cut');
          // nginx logs the request once it gave up on it, after closing its connection to the origin.
          await until(() => nginx.log().includes(`key=${key}`));
          const retry = await post(`${nginx.url}/upload`, key, {
            body: Buffer.alloc(49_152, 97),
            headers: { 'content-type': 'application/octet-stream' },
          });
          expect(retry.status).toBe(201);
          expect(retry.headers['idempotent-replayed']).toBeUndefined();
          expect(JSON.parse(retry.body.toString()).bytes).toBe(49_152);
        }
        expect(s.runs.upload).toBe(4);
        expect(s.events.filter((event) => event.type === 'claim')).toHaveLength(4);
      },
    );
  });
});

describe.each(frameworkNames)('an nginx `proxy_cache` on POST in front of %s', (framework) => {
  it('a first response cached by nginx is not served to another user', async () => {
    // Was a defect: idem marked replays `Cache-Control: no-store` but not first executions, so nginx with `proxy_cache_methods POST` and `proxy_cache_valid` cached Alice's first 201 and served it (her body, her key echoed) to Bob's POST, whose handler never ran; with `$http_idempotency_key` in the cache key, to Bob reusing her key string. Now every answer of a keyed request says `no-store` unless the handler set its own Cache-Control, and nginx keeps none.
    await withProxy(
      { framework, backend: 'memory' },
      ([a]) =>
        startNginx({
          http: 'proxy_cache_path cache keys_zone=writes:1m;',
          server: `location / { proxy_pass http://127.0.0.1:${a}; proxy_cache writes; proxy_cache_methods POST; proxy_cache_valid 200 201 10m; proxy_cache_key "$request_uri$http_idempotency_key"; }`,
        }),
      async (nginx, s) => {
        const alice = await post(`${nginx.url}/charges`, 'guessable-key', { user: 'alice' });
        expect(JSON.parse(alice.body.toString()).user).toBe('alice');
        expect(alice.headers['cache-control']).toBe('no-store');
        const bob = await post(`${nginx.url}/charges`, 'guessable-key', { user: 'bob' });
        expect(s.runs.charges).toBe(2);
        expect(JSON.parse(bob.body.toString()).user).toBe('bob');
        expect(bob.headers['idempotent-replayed']).toBeUndefined();
        await until(() => (nginx.log().match(/key=guessable-key/g)?.length ?? 0) === 2);
        expect(nginx.log()).not.toMatch(/cache=HIT/);
      },
    );
  });

  it('replays carry `Cache-Control: no-store`, so nginx never caches one', async () => {
    await withProxy(
      { framework, backend: 'memory' },
      ([a]) =>
        startNginx({
          http: 'proxy_cache_path cache keys_zone=writes:1m;',
          // Only replays pass through the cache: the first answer goes around it.
          server: `location / { proxy_pass http://127.0.0.1:${a}; proxy_cache writes; proxy_cache_methods POST; proxy_cache_valid 200 201 409 10m; proxy_cache_bypass $http_x_first; proxy_no_cache $http_x_first; }`,
        }),
      async (nginx, s) => {
        await post(`${nginx.url}/charges`, 'replayed', { headers: { 'x-first': '1' } });
        const replays = [
          await post(`${nginx.url}/charges`, 'replayed'),
          await post(`${nginx.url}/charges`, 'replayed'),
        ];
        for (const replay of replays) expect(replay.headers['idempotent-replayed']).toBe('true');
        await until(() => (nginx.log().match(/key=replayed/g)?.length ?? 0) === 3);
        expect(nginx.log()).not.toMatch(/cache=HIT/);
        expect(s.runs.charges).toBe(1);
      },
    );
  });
});
