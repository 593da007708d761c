// The capture tests' server: node:http with the HTTP layer in front of a handler, as an adapter
// mounts it, and a raw client that shows exactly what went out. Shared by capture-end.test.ts and
// capture-edges.test.ts.
import { createServer, type IncomingHttpHeaders, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { transactionalMemoryStore } from '@idem/testkit';
import type { Duration } from '../src/duration.js';
import type { IdempotencyEvent } from '../src/events.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpIdempotencyOptions } from '../src/http-options.js';
import type { CaptureOptions, IdempotencyContext, ResponseCapture } from '../src/http-types.js';
import { writeResponse } from '../src/http-write.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

// What a raw node:http client received: status, headers as Node parsed them, the raw header list
// (to count repeated fields), and the body's exact bytes.
export interface Received {
  status: number;
  /** The reason phrase of the status line. */
  statusMessage: string;
  headers: IncomingHttpHeaders;
  raw: string[];
  body: Buffer;
}

// A POST with a raw client (no fetch: its Headers hide how fields were sent). `leave` aborts the
// request once it resolves. Resolves with what arrived, or rejects when the connection failed.
export function post(base: string, path: string, key: string | undefined, leave?: Promise<void>): Promise<Received> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = key === undefined ? {} : { 'idempotency-key': key };
    const req = request(`${base}${path}`, { method: 'POST', headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          statusMessage: res.statusMessage ?? '',
          headers: res.headers,
          raw: res.rawHeaders,
          body: Buffer.concat(chunks),
        }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    void leave?.then(() => req.destroy(new Error('client left')));
    req.end();
  });
}

export interface ServeOptions {
  store?: Store;
  /** Transactional mode: the handler runs in the store's transaction and the response is held. */
  hold?: boolean;
  maxResponseBytes?: number;
  replayHeaders?: string[];
  /** Told to the capture as `unrouted` (read at the end of the response), with the request's path. */
  unrouted?: (res: ServerResponse, path: string) => boolean;
  /** The engine's lease (its default otherwise). */
  lease?: Duration;
  /** Wraps the response before the capture does, as a layer mounted earlier (compression()) would. */
  below?: (res: ServerResponse) => void;
  /** Pass the key's echo to the capture (`echo`), as Koa's adapter does. */
  echo?: boolean;
  /** Announce `Idempotency-Expires` (`advertiseExpiry`). */
  advertiseExpiry?: boolean;
  /** Any other option of the HTTP layer (`storeOutcome`, `now`, ...), given last. */
  layer?: Partial<HttpIdempotencyOptions<unknown>>;
  /** Writes the first execution's response. */
  answer: (
    res: ServerResponse,
    run: number,
    capture: ResponseCapture,
    context: IdempotencyContext,
    path: string,
  ) => void | Promise<void>;
}

/** A started {@link serve}. */
export interface Served {
  /** Base URL, e.g. `http://127.0.0.1:41234`, for a client of its own (a raw socket). */
  base: string;
  /** A POST with `key` (to `/charges` by default); `leave`: the client leaves once it resolves. */
  post(key: string, path?: string, leave?: Promise<void>): Promise<Received>;
  events: IdempotencyEvent[];
  /** First executions so far. */
  runs(): number;
  /** The `response-not-stored` events so far. */
  notStored(): IdempotencyEvent[];
  close(): Promise<void>;
}

// A node:http server with the HTTP layer in front of `answer`, as an adapter mounts it: replays and
// problems are written with writeResponse, the key is echoed, and the capture settles the outcome
// (or, held, runs the handler in the store's transaction).
export async function serve(options: ServeOptions): Promise<Served> {
  const hold = options.hold ?? false;
  const store = options.store ?? (hold ? transactionalMemoryStore() : memoryStore());
  const events: IdempotencyEvent[] = [];
  const http = createHttpIdempotency({
    store,
    scope: () => 'caller',
    onEvent: (event) => events.push(event),
    transactional: hold,
    ...(options.maxResponseBytes === undefined ? {} : { maxResponseBytes: options.maxResponseBytes }),
    ...(options.replayHeaders === undefined ? {} : { replayHeaders: options.replayHeaders }),
    ...(options.advertiseExpiry === undefined ? {} : { advertiseExpiry: options.advertiseExpiry }),
    ...(options.lease === undefined ? {} : { lease: options.lease }),
    ...options.layer,
  });
  let runs = 0;
  const server = createServer(async (req, res) => {
    const path = req.url ?? '/';
    const started = await http.begin({
      method: 'POST',
      route: path,
      path,
      query: '',
      contentType: undefined,
      keyHeader: http.keyHeader(req),
      body: undefined,
      scope: 'caller',
    });
    if (started.kind !== 'execute') {
      if (started.kind === 'respond') writeResponse(res, started.response);
      else res.end();
      return;
    }
    const run = ++runs;
    const context = http.context(started);
    res.setHeader('idempotency-key', started.echo);
    options.below?.(res);
    const unrouted = options.unrouted;
    const atEnd: CaptureOptions = {
      ...(unrouted === undefined ? {} : { unrouted: () => unrouted(res, path) }),
      ...(options.echo === true ? { echo: started.echo } : {}),
    };
    if (!hold) {
      const capture = http.capture(res, { settle: { lease: started.lease, thrown: () => false }, ...atEnd });
      await options.answer(res, run, capture, context, path);
      return;
    }
    const capture = http.capture(res, { hold: true, ...atEnd });
    void http.runTransaction(
      started.lease,
      capture,
      () => void options.answer(res, run, capture, context, path),
      () => false,
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    base,
    post: (key: string, path = '/charges', leave?: Promise<void>) => post(base, path, key, leave),
    events,
    runs: () => runs,
    notStored: () => events.filter((event) => event.type === 'response-not-stored'),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// A server whose every request is answered by `handle` alone (no idempotency), for writeResponse.
export async function plainServer(handle: (res: ServerResponse) => void) {
  const server = createServer((_req, res) => handle(res));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    post: () => post(base, '/', undefined),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// Resolves once `done()` holds, checking on every turn of the event loop (no fixed sleep).
export async function waitFor(done: () => boolean) {
  while (!done()) await new Promise((resolve) => setImmediate(resolve));
}

// The same records behind promises that settle a few turns later, as a store over a network answers.
export function networkLike(): Store {
  const inner = memoryStore();
  const later = async <T>(value: () => T | Promise<T>): Promise<T> => {
    await new Promise((resolve) => setImmediate(resolve));
    return value();
  };
  return {
    claim: (input) => later(() => inner.claim(input)),
    renew: (input) => later(() => inner.renew(input)),
    complete: (input) => later(() => inner.complete(input)),
    release: (input) => later(() => inner.release(input)),
    get: (id) => later(() => inner.get(id)),
  };
}
