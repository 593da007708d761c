// Shared by the timeout audits of the three adapters: the stores they run on (memory, and the real
// Redis under a prefix of their own), a gate a handler waits on, a plain HTTP client that reports a
// cut connection instead of throwing, a reverse proxy that gives up on its origin as nginx does, and
// the rows every adapter plays against the server's own timeouts (itServerTimeouts).
import { randomBytes } from 'node:crypto';
import http, { type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore, type Store } from '@idem/core';
import { redisStore } from '@idem/redis';
import { frameRequest, type RawAnswer, redisAnswers, sendRaw, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, expect, it } from 'vitest';
import { deleteKeys } from '../../../redis/test/redis-env.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A store for one test, and what to do once the file is done with the backend. */
export interface StoreBackend {
  name: string;
  store: () => Store;
  close: () => Promise<void>;
}

/**
 * The memory store, and the real Redis under `audit-timeouts:` when it answers; closed after the
 * file's tests (an `afterAll` of the calling file).
 */
export async function timeoutBackends(file: string): Promise<StoreBackend[]> {
  const backends: StoreBackend[] = [{ name: 'memory', store: () => memoryStore(), close: async () => undefined }];
  afterAll(async () => {
    for (const backend of backends) await backend.close();
  });
  if (!serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), `${file} over Redis`)) return backends;
  const client = new Redis(redisUrl);
  const prefix = `audit-timeouts:${file}:${randomBytes(4).toString('hex')}:`;
  let n = 0;
  backends.push({
    name: 'redis',
    store: () => redisStore({ client, prefix: `${prefix}${++n}:` }),
    close: async () => {
      await deleteKeys(client, prefix);
      await client.quit();
    },
  });
  return backends;
}

/** A promise and the function that settles it: what a handler waits on until the test lets it go. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** What came back: an answer, or the connection cut before one (`status` 0). */
export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
  error?: string;
}

/** POSTs `body` as JSON with `key`, on a fresh connection unless an agent is given. */
export function post(
  url: string,
  key: string,
  body: unknown = { amount: 100 },
  agent: http.Agent | false = false,
): Promise<Answer> {
  const bytes = Buffer.from(JSON.stringify(body));
  return new Promise((resolve) => {
    const req = http.request(
      url,
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': bytes.length, 'idempotency-key': key },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
        );
        res.on('error', (error) => resolve({ status: 0, headers: {}, body: '', error: error.message }));
      },
    );
    req.on('error', (error) => resolve({ status: 0, headers: {}, body: '', error: (error as Error).message }));
    req.end(bytes);
  });
}

/**
 * Resolves once `check` is true, polling every 10 ms; rejects after `limitMs`. For waiting on a
 * handler that runs on its own (the test never sleeps a fixed time).
 */
export async function until(check: () => boolean, limitMs = 10_000): Promise<void> {
  const started = Date.now();
  while (!check()) {
    if (Date.now() - started > limitMs) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Listens on an ephemeral port of 127.0.0.1; returns the URL and a close that cuts every connection. */
export async function listen(server: http.Server): Promise<{ url: string; close: () => Promise<void> }> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Options of {@link timeoutProxy}. */
export interface TimeoutProxyOptions {
  /** The origins, tried in order (nginx's `proxy_next_upstream timeout` with `non_idempotent`). */
  upstreams: string[];
  /** On a timeout, send the same request to the next origin. Default false: answer 504. */
  nextUpstream?: boolean;
}

/**
 * A reverse proxy as nginx is one: it forwards the request and, when its timeout comes (nginx's
 * `proxy_read_timeout`), gives up on an origin that has not answered (closing its connection to
 * it, as nginx does), then either answers 504 or sends the same request to the next origin. It
 * counts what each origin was sent. The timeout comes when the test calls `timeOut()`, not on a
 * timer: with a real 300 ms one, a loaded box (CI, load 10) once took longer than that to pass on
 * the origin's 409, and the proxy turned the answer under test into its own 504.
 */
export async function timeoutProxy(options: TimeoutProxyOptions) {
  const sent = options.upstreams.map(() => 0);
  // What a timeout does to each forwarded request still waiting for its origin's answer.
  const waiting = new Set<() => void>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const attempt = (index: number) => {
        const upstream = options.upstreams[index];
        if (upstream === undefined) {
          res.writeHead(504, { 'content-type': 'text/plain' }).end('upstream timed out');
          return;
        }
        sent[index] = (sent[index] ?? 0) + 1;
        const forwarded = http.request(upstream + (req.url ?? '/'), {
          method: req.method,
          agent: false,
          headers: { ...req.headers, connection: 'close' },
        });
        let gaveUp = false;
        const giveUp = () => {
          waiting.delete(giveUp);
          gaveUp = true;
          forwarded.destroy();
          if (options.nextUpstream) attempt(index + 1);
          else res.writeHead(504, { 'content-type': 'text/plain' }).end('upstream timed out');
        };
        waiting.add(giveUp);
        forwarded.on('response', (answer) => {
          waiting.delete(giveUp);
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        });
        forwarded.on('error', () => {
          // A connection the timeout destroyed has been answered for already.
          if (gaveUp || res.headersSent) return;
          waiting.delete(giveUp);
          res.writeHead(502, { 'content-type': 'text/plain' }).end('bad gateway');
        });
        forwarded.end(body);
      };
      attempt(0);
    });
  });
  const listening = await listen(server);
  return {
    ...listening,
    sent: () => [...sent],
    /** The proxy's timeout: it gives up on every origin that has not answered yet. */
    timeOut: () => {
      for (const giveUp of [...waiting]) giveUp();
    },
  };
}

/**
 * Sends the request again while it gets 409 (the first attempt still running), as a client backs
 * off and retries (spec part 7): what the key's retries end up with once the first run settled.
 */
export async function retryPast409(url: string, key: string, body?: unknown, limitMs = 10_000): Promise<Answer> {
  const started = Date.now();
  for (;;) {
    const answer = await post(url, key, body);
    if (answer.status !== 409 || Date.now() - started > limitMs) return answer;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** An adapter's app for {@link itServerTimeouts}: its POST /charges waits on `provider`, counting its effects. */
export interface TimeoutApp {
  /** The URL of POST /charges. */
  url: string;
  port: number;
  effects: { started: number; finished: number };
  provider: { open: () => void };
  /** The adapter's events (its `onEvent`). */
  events: IdempotencyEvent[];
  close: () => Promise<void>;
}

/** How one adapter sets the server's timeouts, for {@link itServerTimeouts}. */
export interface ServerTimeouts {
  /** The idle-socket setting, as the rows' names say it: `server.timeout`, `connectionTimeout`. */
  idle: string;
  /** The request-timeout setting, as the rows' names say it. */
  request: string;
  /** The app on a server whose sockets are cut after `ms` idle. */
  idleApp: (store: Store, ms: number) => Promise<TimeoutApp>;
  /** The app on a server with requestTimeout 400 ms, headersTimeout 300 ms, checked every 50 ms. */
  requestApp: (store: Store) => Promise<TimeoutApp>;
}

/**
 * The scenario of a connection cut while the handler runs, by a timeout (the app's `key` answered
 * nothing: the client sees it cut): the handler goes on, its key stays in progress (409, not free,
 * not stored as a failure) until it ends, then its 201 is stored and replayed; one effect.
 */
export async function cutMidHandler(app: Pick<TimeoutApp, 'url' | 'effects' | 'provider'>, key: string): Promise<void> {
  const first = await post(app.url, key);
  expect(first.status).toBe(0);
  expect(app.effects.started).toBe(1);
  expect((await post(app.url, key)).status).toBe(409);
  app.provider.open();
  await until(() => app.effects.finished === 1);
  const retry = await retryPast409(app.url, key);
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
  expect(app.effects.started).toBe(1);
}

/**
 * Sends the head of a charge with `key` and five bytes of its body, then nothing, until the server's
 * timeout cuts it (`cutAnswered` checks what it answered); nothing may have run, and the retry runs
 * the handler once. Closes `app`.
 */
async function uploadCutThenRetried(
  app: TimeoutApp,
  key: string,
  cutAnswered: (cut: RawAnswer) => Promise<void> | void = () => undefined,
): Promise<void> {
  app.provider.open();
  try {
    const framed = frameRequest(
      `POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: ${key}\r\n`,
      Buffer.from(JSON.stringify({ amount: 100 })),
    );
    const cut = await sendRaw(app.port, framed.bytes, framed.headEnd + 5, undefined, 8_000);
    expect(cut.timedOut).toBe(false);
    await cutAnswered(cut);
    expect(app.effects.started).toBe(0);
    const retry = await post(app.url, key);
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(app.effects.started).toBe(1);
  } finally {
    await app.close();
  }
}

/**
 * The rows every adapter plays against the server's own timeouts, on one backend: a socket cut
 * mid-handler, and an upload cut by an idle socket or by the request timeout. Call it inside the
 * adapter's `describe.each(backends)`.
 */
export function itServerTimeouts(backend: StoreBackend, server: ServerTimeouts): void {
  it(`${server.idle} cuts the socket mid-handler; the handler finishes, its outcome is stored and replayed`, async () => {
    const app = await server.idleApp(backend.store(), 300);
    try {
      // Node destroys an idle socket whose timeout nobody listens for.
      await cutMidHandler(app, 'socket-timeout');
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it(`${server.idle} cuts an upload that stalls; nothing is claimed, the retry runs once`, async () => {
    // A second, not 300 ms: the retry's own connection has the same idle limit, and on a loaded box
    // its handler and store calls once took longer than 300 ms, so the retry itself was cut.
    const app = await server.idleApp(backend.store(), 1_000);
    await uploadCutThenRetried(app, 'socket-timeout-body');
  });

  it(`${server.request} cuts a body mid-upload; nothing is claimed, the retry runs once`, async () => {
    const app = await server.requestApp(backend.store());
    await uploadCutThenRetried(app, 'request-timeout', async (cut) => {
      // Node's request timeout answers 408; the adapter saw the body cut short and claimed nothing.
      expect(cut.status).toBe(408);
      await until(() => app.events.some((event) => event.type === 'refused'));
      expect(app.events.map((event) => (event.type === 'refused' ? event.code : event.type))).toEqual([
        'body_incomplete',
      ]);
    });
  });
}
