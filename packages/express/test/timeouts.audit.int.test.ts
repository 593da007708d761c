// Audit: what the server's own timeouts, and a timeout middleware that answers for the handler, do
// to the key, the stored outcome and the side effect, over real sockets, on the memory store and on
// Redis. The right behaviour: exactly one effect, and the key's retries end up with the handler's
// real outcome; a timeout answer written by someone else while the handler still runs must never
// become the key's stored outcome.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import { frameRequest, sendRaw } from '@idem/testkit';
import express, { type RequestHandler } from 'express';
import { describe, expect, it } from 'vitest';
import {
  gate,
  listen,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';

const backends: StoreBackend[] = await timeoutBackends('express');

// connect-timeout (1.9), as its README shows it: after `ms` it marks the request timed out and
// hands Express a 503 error (`code: 'ETIMEDOUT'`) while the handler goes on. The package is not
// installed here; these are its lines, with on-finished reduced to the response's own events.
function connectTimeout(ms: number): RequestHandler {
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

interface AppOptions {
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
async function start(options: AppOptions) {
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
  return { ...listening, url: `${listening.url}/charges`, server, effects, provider, events };
}

describe.each(backends)('Express on $name: server timeouts around idempotency()', (backend) => {
  it('HELD: server.timeout cuts the socket mid-handler; the handler finishes, its outcome is stored and replayed', async () => {
    const app = await start({ store: backend.store(), configure: (server) => server.setTimeout(300) });
    try {
      const first = await post(app.url, 'socket-timeout');
      // Node destroys an idle socket whose timeout nobody listens for: the client sees it cut.
      expect(first.status).toBe(0);
      expect(app.effects.started).toBe(1);
      // The handler still runs: its key is in progress, not free, not stored as a failure.
      expect((await post(app.url, 'socket-timeout')).status).toBe(409);
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await retryPast409(app.url, 'socket-timeout');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('HELD: res.setTimeout with no callback cuts the socket as server.timeout does; one effect, real outcome replayed', async () => {
    const app = await start({
      store: backend.store(),
      before: [
        (_req, res, next) => {
          res.setTimeout(300);
          next();
        },
      ],
    });
    try {
      expect((await post(app.url, 'res-timeout')).status).toBe(0);
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await retryPast409(app.url, 'res-timeout');
      expect(retry.status).toBe(201);
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('HELD: server.requestTimeout cuts a body mid-upload; nothing is claimed, the retry runs once', async () => {
    const app = await start({
      store: backend.store(),
      server: { requestTimeout: 400, headersTimeout: 300, connectionsCheckingInterval: 50 },
    });
    app.provider.open();
    try {
      const { port } = app.server.address() as AddressInfo;
      const body = Buffer.from(JSON.stringify({ amount: 100 }));
      const framed = frameRequest(
        'POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: request-timeout\r\n',
        body,
      );
      // The head and five bytes of the body, then nothing: Node's request timeout answers 408.
      const cut = await sendRaw(port, framed.bytes, framed.headEnd + 5, undefined, 8_000);
      expect(cut.timedOut).toBe(false);
      expect(cut.status).toBe(408);
      expect(app.effects.started).toBe(0);
      // The client got Node's 408; the middleware saw the body cut short and claimed nothing.
      await until(() => app.events.some((event) => event.type === 'refused'));
      expect(app.events.map((event) => (event.type === 'refused' ? event.code : event.type))).toEqual([
        'body_incomplete',
      ]);
      const retry = await post(app.url, 'request-timeout');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(app.effects.started).toBe(1);
    } finally {
      await app.close();
    }
  });

  it('HELD: server.timeout cuts an upload that stalls; nothing is claimed, the retry runs once', async () => {
    const app = await start({ store: backend.store(), configure: (server) => server.setTimeout(300) });
    app.provider.open();
    try {
      const { port } = app.server.address() as AddressInfo;
      const framed = frameRequest(
        'POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: socket-timeout-body\r\n',
        Buffer.from(JSON.stringify({ amount: 100 })),
      );
      const cut = await sendRaw(port, framed.bytes, framed.headEnd + 5, undefined, 8_000);
      expect(cut.timedOut).toBe(false);
      expect(app.effects.started).toBe(0);
      const retry = await post(app.url, 'socket-timeout-body');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(app.effects.started).toBe(1);
    } finally {
      await app.close();
    }
  });

  it('HELD: server.requestTimeout counts only the upload: a handler running past it is not cut, its 201 is the outcome', async () => {
    const app = await start({
      store: backend.store(),
      server: { requestTimeout: 200, headersTimeout: 150, connectionsCheckingInterval: 25 },
    });
    try {
      const first = post(app.url, 'request-timeout-handler');
      await until(() => app.effects.started === 1);
      // Several checking rounds past the request timeout, the handler still holding the answer.
      let rounds = 0;
      const ticking = setInterval(() => rounds++, 25);
      await until(() => rounds >= 24);
      clearInterval(ticking);
      app.provider.open();
      const answer = await first;
      expect(answer.status).toBe(201);
      const retry = await post(app.url, 'request-timeout-handler');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  // Was wrong (fixed): connect-timeout's 503 was settled as the key's outcome while the handler still
  // ran: under the default policy stored, and every retry replayed 503 for the retention although the
  // charge was made; under 'stripe' (idempotencyErrors() took its error for a throw) or 'success' the
  // key was released, and the retry ran the handler a second time, concurrently. Express never says
  // when the handler ends, so idempotencyErrors() recognises connect-timeout's error and the key is
  // kept at once with `500 response_not_replayable`, whatever the policy says: the 503 is served
  // unstored, and the retry learns the operation ran and never runs it again.
  it.each(['all', 'stripe', 'success'] as const)(
    "connect-timeout (storeOutcome '%s'): the 503 is not stored; the retry gets the replayed 500 response_not_replayable, one effect",
    async (storeOutcome) => {
      const app = await start({ store: backend.store(), before: [connectTimeout(300)], storeOutcome });
      const key = `connect-timeout-${storeOutcome}`;
      try {
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
        expect(
          app.events.some((event) => event.type === 'response-not-stored' && event.reason === 'answered-early'),
        ).toBe(true);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  // Was wrong (fixed with the above): connect-timeout firing while the handler streams its answer
  // (head sent) cannot write its 503, so Express destroys the socket; the capture took it for a
  // stream cut short and the policy judged its 201: a policy that releases it (a function that
  // releases all but what it knows) let the retry run the handler a second time while the first ran.
  it.each([
    ['all', 'all'],
    ['a function that releases every outcome', () => false],
  ] as const)(
    'connect-timeout while the handler streams (storeOutcome %s): the cut answer keeps the key, the retry never runs it again',
    async (name, storeOutcome) => {
      const app = await start({ store: backend.store(), before: [connectTimeout(300)], storeOutcome, streams: true });
      const key = `connect-timeout-stream-${name.replaceAll(' ', '-')}`;
      try {
        const first = await post(app.url, key);
        expect(first.status === 0 || first.status === 201).toBe(true);
        const during = await retryPast409(app.url, key);
        expect(during.status).toBe(500);
        expect(JSON.parse(during.body)).toMatchObject({ code: 'response_not_replayable' });
        app.provider.open();
        await until(() => app.effects.finished === 1);
        expect(app.effects.started).toBe(1);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  it.each(['all', 'stripe'] as const)(
    "HELD: a handler's own ETIMEDOUT 503 (an upstream call that timed out, no `timeout` field) is its failure, judged by the policy '%s' as before",
    async (storeOutcome) => {
      const failWith = Object.assign(new Error('upstream timed out'), { status: 503, code: 'ETIMEDOUT' });
      const app = await start({ store: backend.store(), storeOutcome, failWith });
      app.provider.open();
      const key = `own-timeout-${storeOutcome}`;
      try {
        expect((await post(app.url, key)).status).toBe(503);
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(503);
        if (storeOutcome === 'all') {
          // Stored as the handler's answer and replayed.
          expect(retry.headers['idempotent-replayed']).toBe('true');
          expect(app.effects.started).toBe(1);
        } else {
          // 'stripe' releases a thrown handler: the retry ran it again.
          expect(retry.headers['idempotent-replayed']).toBeUndefined();
          expect(app.effects.started).toBe(2);
        }
      } finally {
        await app.close();
      }
    },
  );

  // Was wrong (fixed): the same with `res.setTimeout(ms, callback)` answering 503 itself, the pattern
  // of many Express timeout snippets: the callback's 503 was settled as the key's outcome (stored and
  // replayed for the retention under the default policy, though the handler made its charge after;
  // under 'stripe' or 'success' the key was released and the retry ran the handler a second time,
  // concurrently). The capture now sees an answer written inside a response 'timeout' listener (one
  // added before idempotency() or after it) as connect-timeout's: served, never stored, the key kept
  // at once with `500 response_not_replayable`. The handler's real 201 cannot be had: Express never
  // says when it ends, and its late answer goes nowhere.
  const resTimeout503: RequestHandler = (_req, res, next) => {
    res.setTimeout(300, () => {
      if (!res.headersSent) res.status(503).json({ error: 'timeout' });
    });
    next();
  };
  it.each([
    ['all', 'before'],
    ['stripe', 'before'],
    ['success', 'before'],
    ['all', 'after'],
    ['stripe', 'after'],
  ] as const)(
    "res.setTimeout answering 503 (storeOutcome '%s', set %s idempotency()): not stored; the retry gets the replayed 500 response_not_replayable, one effect",
    async (storeOutcome, where) => {
      const app = await start({ store: backend.store(), storeOutcome, [where]: [resTimeout503] });
      const key = `res-timeout-503-${storeOutcome}-${where}`;
      try {
        const first = await post(app.url, key);
        expect(first.status).toBe(503);
        expect(first.headers['idempotent-replayed']).toBeUndefined();
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
        expect(
          app.events.some((event) => event.type === 'response-not-stored' && event.reason === 'answered-early'),
        ).toBe(true);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  // The mark lasts only while the listener runs and only if it answers: a timeout callback that
  // logs and leaves the answer to the handler leaves the handler's 201 the outcome, replayed.
  it.each(['before', 'after'] as const)(
    'a res.setTimeout callback that writes nothing (set %s idempotency()): the handler answers 201 later, stored and replayed',
    async (where) => {
      let fired = 0;
      const logOnly: RequestHandler = (_req, res, next) => {
        res.setTimeout(200, () => {
          fired++;
        });
        next();
      };
      const app = await start({ store: backend.store(), [where]: [logOnly] });
      const key = `res-timeout-log-${where}`;
      try {
        const first = post(app.url, key);
        await until(() => fired === 1);
        app.provider.open();
        expect((await first).status).toBe(201);
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
        expect(app.effects.started).toBe(1);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );
});
