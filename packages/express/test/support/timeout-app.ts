// The Express app the timeout audits run: POST /charges behind idempotency(), on a real node:http
// server, with middleware of the test's own before or after it, and connect-timeout as its README has it.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import express, { type RequestHandler } from 'express';
import { expect } from 'vitest';
import { gate, listen, post, retryPast409, until } from '../../../core/test/support/timeouts-kit.js';

// connect-timeout (1.9), as its README shows it: after `ms` it marks the request timed out and
// hands Express a 503 error (`code: 'ETIMEDOUT'`) while the handler goes on. The package is not
// installed here; these are its lines, with on-finished reduced to the response's own events.
export function connectTimeout(ms: number): RequestHandler {
  return (req, res, next) => {
    const timer = setTimeout(() => {
      (req as { timedout?: boolean }).timedout = true;
      const error = Object.assign(new Error('Response timeout'), {
        status: 503,
        statusCode: 503,
        expose: true,
        code: 'ETIMEDOUT',
        timeout: ms,
      });
      next(error);
    }, ms);
    res.once('finish', () => clearTimeout(timer));
    res.once('close', () => clearTimeout(timer));
    next();
  };
}

export interface AppOptions {
  store: Store;
  /** Middleware mounted ahead of idempotency() (a timeout, say). */
  before?: RequestHandler[];
  /** Middleware mounted after idempotency() and the body parser, ahead of the route. */
  after?: RequestHandler[];
  storeOutcome?: 'all' | 'stripe' | 'success' | (() => boolean);
  /** Options of the node:http server the app runs on. */
  server?: http.ServerOptions;
  /** The handler writes its head and a first chunk before it waits (a streamed answer). */
  streams?: boolean;
  /** The handler throws this once it is let go, instead of answering 201. */
  failWith?: Error;
  /** Set up on the server once it exists (its timeouts). */
  configure?: (server: http.Server) => void;
}

// One route, POST /charges: its effect counts, then it waits for the test to let it answer, as a
// slow payment provider would. A handler that follows connect-timeout's README answers only when
// the request has not timed out.
export async function start(options: AppOptions) {
  const effects = { started: 0, finished: 0 };
  const provider = gate();
  const events: IdempotencyEvent[] = [];
  const app = express();
  app.use((req, _res, next) => {
    (req as { auth?: unknown }).auth = { sub: 'user-1', iss: 'https://issuer.test' };
    next();
  });
  for (const middleware of options.before ?? []) app.use(middleware);
  app.use(
    idempotency({
      store: options.store,
      storeOutcome: options.storeOutcome ?? 'all',
      storeTimeout: '15s',
      onEvent: (event) => events.push(event),
    }),
  );
  app.use(express.json());
  for (const middleware of options.after ?? []) app.use(middleware);
  app.post('/charges', async (req, res) => {
    const id = `ch_${++effects.started}`;
    if (options.streams) res.status(201).type('application/json').write('[');
    await provider.promise;
    effects.finished++;
    if (options.failWith) throw options.failWith;
    if (options.streams && !res.destroyed) {
      res.end(`"${id}"]`);
      return;
    }
    if ((req as { timedout?: boolean }).timedout || res.headersSent) return;
    res.status(201).json({ id });
  });
  app.use(idempotencyErrors());
  const server = http.createServer(options.server ?? {}, app);
  options.configure?.(server);
  const listening = await listen(server);
  const { port } = server.address() as AddressInfo;
  return { ...listening, url: `${listening.url}/charges`, port, server, effects, provider, events };
}

/**
 * The scenario of a timeout that answers 503 for the handler while it runs (connect-timeout, or a
 * res.setTimeout callback), on an app of {@link start}: the 503 is served unstored, the key is kept
 * at once with 500 response_not_replayable (replayed while the handler runs and after it ended, so
 * the retry learns the operation ran), and the handler runs once.
 */
export async function answeredEarly(app: Awaited<ReturnType<typeof start>>, key: string): Promise<void> {
  const first = await post(app.url, key);
  expect(first.status).toBe(503);
  expect(first.headers['idempotent-replayed']).toBeUndefined();
  expect(app.effects.started).toBe(1);
  // The handler still runs: the retry is told the operation ran, not that its outcome is a 503.
  const during = await post(app.url, key);
  expect(during.status).toBe(500);
  expect(during.headers['idempotent-replayed']).toBe('true');
  expect(JSON.parse(during.body)).toMatchObject({ code: 'response_not_replayable' });
  app.provider.open();
  await until(() => app.effects.finished === 1);
  const retry = await retryPast409(app.url, key);
  expect(retry.status).toBe(500);
  expect(JSON.parse(retry.body)).toMatchObject({ code: 'response_not_replayable' });
  expect(app.effects.started).toBe(1);
  expect(app.events.some((event) => event.type === 'response-not-stored' && event.reason === 'answered-early')).toBe(
    true,
  );
}
