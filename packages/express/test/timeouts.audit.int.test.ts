import type { RequestHandler } from 'express';
import { describe, expect, it } from 'vitest';
import {
  cutMidHandler,
  itServerTimeouts,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';
import { answeredEarly, connectTimeout, start } from './support/timeout-app.js';

const backends: StoreBackend[] = await timeoutBackends('express');

describe.each(backends)('Express on $name: server timeouts around idempotency()', (backend) => {
  itServerTimeouts(backend, {
    idle: 'server.timeout',
    request: 'server.requestTimeout',
    idleApp: (store, ms) => start({ store, configure: (server) => server.setTimeout(ms) }),
    requestApp: (store) =>
      start({ store, server: { requestTimeout: 400, headersTimeout: 300, connectionsCheckingInterval: 50 } }),
  });

  it('res.setTimeout with no callback cuts the socket as server.timeout does; one effect, real outcome replayed', async () => {
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
      await cutMidHandler(app, 'res-timeout');
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('server.requestTimeout counts only the upload: a handler running past it is not cut, its 201 is the outcome', async () => {
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
        await answeredEarly(app, key);
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
    "a handler's own ETIMEDOUT 503 (an upstream call that timed out, no `timeout` field) is its failure, judged by the policy '%s': 'all' replays it, 'stripe' runs the retry again",
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
        await answeredEarly(app, key);
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
