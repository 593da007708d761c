// Review of the capture's watch on response 'timeout' listeners (an answer written inside one is an
// answer for a running handler, never stored): what else it changed for listeners that answer
// nothing, for the listeners' identity (removeListener, once) and for transactional mode, over real
// sockets, on the memory store, Redis and PostgreSQL.
import http from 'node:http';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import type { PostgresTransaction } from '@idem/postgres';
import express, { type RequestHandler } from 'express';
import { describe, expect, it } from 'vitest';
import {
  cutMidHandler,
  gate,
  listen,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';
import { postgresForTimeouts, transactionalTables } from '../../core/test/support/transactional-tables.js';
import { start } from './support/timeout-app.js';

const backends: StoreBackend[] = await timeoutBackends('express-review');

describe.each(backends)('Express on $name: res timeout listeners that answer nothing', (backend) => {
  // Was wrong: the mark an answering listener sets was taken back only while no head had gone out,
  // so a listener that only logs, firing while the handler streamed its answer (its head sent), left
  // the mark on: the handler's own complete answer was then settled as an answer for a running
  // handler, never stored, and every retry got 500 response_not_replayable instead of its replay.
  it.each(['before', 'after'] as const)(
    'a logging res.setTimeout callback (set %s idempotency()) firing while the handler streams: its answer is stored and replayed',
    async (where) => {
      let fired = 0;
      const logOnly: RequestHandler = (_req, res, next) => {
        res.setTimeout(150, () => {
          fired++;
        });
        next();
      };
      const app = await start({ store: backend.store(), streams: true, [where]: [logOnly] });
      const key = `review-log-streaming-${where}`;
      try {
        const first = post(app.url, key);
        await until(() => fired === 1);
        app.provider.open();
        const answer = await first;
        expect(answer.status).toBe(201);
        expect(answer.body).toBe('["ch_1"]');
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(retry.body).toBe('["ch_1"]');
        expect(app.effects.started).toBe(1);
        expect(app.events.some((event) => event.type === 'response-not-stored')).toBe(false);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  // Was wrong: a timeout callback that cuts the response (`res.destroy()`, what Node itself does to a
  // timed-out socket nobody listens for) made the capture take the close for a server that gave up on
  // the response: the key was released while the handler still ran, and the client's retry ran it a
  // second time, concurrently. Node's own cut keeps the key while the handler runs and stores its
  // outcome; the callback's cut now does the same.
  it.each(['before', 'after'] as const)(
    "a res.setTimeout callback (set %s idempotency()) that destroys the response: one effect, the handler's 201 stored and replayed",
    async (where) => {
      const cut: RequestHandler = (_req, res, next) => {
        res.setTimeout(150, () => res.destroy());
        next();
      };
      const app = await start({ store: backend.store(), [where]: [cut] });
      const key = `review-destroy-${where}`;
      try {
        await cutMidHandler(app, key);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  // Was wrong: the capture put its own function in place of each listener, so `removeListener` with
  // the function the app registered found nothing to remove: a timeout answer the app had taken back
  // (a route that allows itself longer) still went out, a 503 in place of the handler's 201, and the
  // key was kept as 500 response_not_replayable.
  it.each(['before', 'after'] as const)(
    'a timeout callback registered %s idempotency() and removed by the route is not called; the 201 is stored',
    async (where) => {
      let fired = 0;
      const answer503 = new WeakMap<object, () => void>();
      const register: RequestHandler = (_req, res, next) => {
        const onTimeout = () => {
          if (!res.headersSent) res.status(503).json({ error: 'timeout' });
        };
        answer503.set(res, onTimeout);
        res.setTimeout(150, onTimeout);
        next();
      };
      // This route takes longer: it drops the app's timeout answer and only notes the timeout.
      const allowLonger: RequestHandler = (_req, res, next) => {
        res.removeListener('timeout', answer503.get(res) as () => void);
        res.on('timeout', () => {
          fired++;
        });
        next();
      };
      const app = await start({
        store: backend.store(),
        before: where === 'before' ? [register] : [],
        after: where === 'after' ? [register, allowLonger] : [allowLonger],
      });
      const key = `review-removed-${where}`;
      try {
        const first = post(app.url, key);
        await until(() => fired === 1);
        app.provider.open();
        expect((await first).status).toBe(201);
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(app.effects.started).toBe(1);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  // Was wrong: a `once` listener there before the capture came back as an `on` one (Node's once
  // wrapper, put back by the capture, could not remove itself), so after it fired the response still
  // had a 'timeout' listener: Node destroys a timed-out socket only when there is none, so a later
  // idle timeout left the socket open instead of cutting it. And `listeners('timeout')` gave the
  // capture's functions, not the app's. The listeners are as the app left them.
  it("a once listener there before idempotency() is the app's own function, and gone once it fired", async () => {
    let fired = 0;
    const onTimeout = () => {
      fired++;
    };
    const once: RequestHandler = (_req, res, next) => {
      res.once('timeout', onTimeout);
      res.setTimeout(150);
      next();
    };
    let response: http.ServerResponse | undefined;
    const keep: RequestHandler = (_req, res, next) => {
      response = res;
      next();
    };
    const app = await start({ store: backend.store(), before: [once], after: [keep] });
    try {
      const first = post(app.url, 'review-once');
      await until(() => app.effects.started === 1);
      const res = response as http.ServerResponse;
      expect(res.listeners('timeout')).toEqual([onTimeout]);
      await until(() => fired === 1);
      expect(res.listenerCount('timeout')).toBe(0);
      app.provider.open();
      expect((await first).status).toBe(201);
      expect(fired).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });
});

const withPostgres = await postgresForTimeouts('the transactional timeout listener review');

describe.runIf(withPostgres)('Express transactional on PostgreSQL: an answer written in a timeout listener', () => {
  const db = transactionalTables('review_timeout');
  const { effects, run, steps } = db;

  // A handler writes half its effect in the transaction, then waits on its provider; the app's
  // timeout callback answers for it meanwhile (202 "still working", or 503).
  // `status` 0: connect-timeout's way instead (its 503 error handed to next() after 150 ms).
  async function startHeld(status: number) {
    const provider = gate();
    const failures: unknown[] = [];
    const app = express();
    app.use((req, res, next) => {
      (req as { auth?: unknown }).auth = { sub: 'user-1', iss: 'https://issuer.test' };
      if (status === 0) {
        const timer = setTimeout(() => {
          (req as { timedout?: boolean }).timedout = true;
          next(Object.assign(new Error('Response timeout'), { status: 503, code: 'ETIMEDOUT', timeout: 150 }));
        }, 150);
        res.once('close', () => clearTimeout(timer));
      } else {
        res.setTimeout(150, () => {
          if (!res.headersSent) res.status(status).json({ status: 'pending' });
        });
      }
      next();
    });
    app.use(idempotency({ store: db.store(), transactional: true, storeTimeout: '15s' }));
    app.use(express.json());
    app.post('/charges', async (req, res) => {
      const tx = req.idempotency?.tx as PostgresTransaction;
      const key = String(req.headers['idempotency-key']);
      try {
        await tx.query(`INSERT INTO "${effects}" (key, step) VALUES ($1, 'debit')`, [key]);
        await provider.promise;
        await tx.query(`INSERT INTO "${effects}" (key, step) VALUES ($1, 'credit')`, [key]);
        if (!res.headersSent) res.status(201).json({ ok: true });
      } catch (error) {
        failures.push(error);
      }
    });
    app.use(idempotencyErrors());
    const listening = await listen(http.createServer(app));
    return { ...listening, url: `${listening.url}/charges`, provider, failures };
  }

  // Was wrong: held, the capture paid no heed to the mark: the listener's answer was the
  // transaction's outcome. A 2xx ("still working") committed the handler's writes so far (a debit
  // without its credit) and was replayed as the outcome; a 503 was stored and replayed for the
  // retention (default policy) though nothing of the operation was kept, so the key could never run
  // it. So did connect-timeout's 503 (idempotencyErrors() marks it, and held mode ignored the mark).
  // Now the transaction rolls back, the client is told to retry (503 store_unavailable), the key is
  // released, and the retry runs the operation once, whole.
  it.each([
    [202, 'a 202 written in the listener'],
    [503, 'a 503 written in the listener'],
    [0, "connect-timeout's 503"],
  ])(
    '%i: %s while the handler is mid-transaction rolls it back; the retry runs it once, whole',
    async (status, _name) => {
      const app = await startHeld(status);
      const key = `review-held-${status}-${run}`;
      try {
        const first = await post(app.url, key);
        expect(first.status).toBe(503);
        expect(JSON.parse(first.body)).toMatchObject({ code: 'store_unavailable' });
        app.provider.open();
        // The first handler goes on, and its transaction refuses its next write.
        await until(() => app.failures.length === 1);
        expect(String(app.failures[0])).toMatch(/transaction is over/);
        expect(await steps(key)).toEqual([]);
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(await steps(key)).toEqual(['credit', 'debit']);
        const replay = await post(app.url, key);
        expect(replay.status).toBe(201);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(await steps(key)).toEqual(['credit', 'debit']);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );
});

// Over HTTP/2 `res.setTimeout(ms, callback)` puts the callback on the response's stream, not on the
// response (the idem middleware on a plain node:http2 server, as on a Connect-style app).
// Was wrong: a callback set before the middleware was not seen (only the response's own listeners
// were looked at), so its 503 was settled as the key's outcome; and one taken back with
// `res.setTimeout(0, callback)` (which removes that function from the stream) stayed, wrapped.
describe('the idem middleware on node:http2: a res.setTimeout callback', () => {
  async function startH2(takeBack: boolean) {
    const provider = gate();
    const effects = { started: 0, finished: 0, timedOut: 0 };
    const middleware = idempotency({ store: memoryStore(), scope: () => 'tenant_1' });
    const server = http2.createServer((req, res) => {
      (req as unknown as { originalUrl?: string }).originalUrl = req.url;
      const answer503 = () => {
        if (!res.headersSent) {
          res.statusCode = 503;
          res.end('timeout');
        }
      };
      res.setTimeout(150, answer503);
      const next = () => {
        req.resume();
        req.on('end', async () => {
          effects.started++;
          if (takeBack) {
            // Taken back, and a callback that only notes the timeout in its place.
            res.setTimeout(0, answer503);
            res.setTimeout(150, () => {
              effects.timedOut++;
            });
          }
          await provider.promise;
          effects.finished++;
          if (res.headersSent || res.stream.destroyed) return;
          res.statusCode = 201;
          res.setHeader('content-type', 'application/json');
          res.end(JSON.stringify({ id: `ch_${effects.started}` }));
        });
      };
      middleware(req as never, res as never, next);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    const send = (key: string) =>
      new Promise<{ status: number; body: string; replayed: unknown }>((resolve, reject) => {
        const stream = session.request({
          ':method': 'POST',
          ':path': '/charges',
          'content-type': 'application/json',
          'idempotency-key': key,
        });
        let status = 0;
        let replayed: unknown;
        const chunks: Buffer[] = [];
        stream.on('response', (headers) => {
          status = Number(headers[':status']);
          replayed = headers['idempotent-replayed'];
        });
        stream.on('data', (chunk: Buffer) => chunks.push(chunk));
        stream.on('end', () => resolve({ status, body: Buffer.concat(chunks).toString(), replayed }));
        stream.on('error', reject);
        stream.end('{"amount":100}');
      });
    const close = async () => {
      session.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    };
    return { provider, effects, send, close };
  }

  it('answering 503 there: served, not stored; the retry gets 500 response_not_replayable, one effect', async () => {
    const app = await startH2(false);
    try {
      const first = await app.send('h2-timeout');
      expect(first.status).toBe(503);
      expect(first.body).toBe('timeout');
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await app.send('h2-timeout');
      expect(retry.status).toBe(500);
      expect(JSON.parse(retry.body)).toMatchObject({ code: 'response_not_replayable' });
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('taken back with res.setTimeout(0, callback): never called, the 201 is stored and replayed', async () => {
    const app = await startH2(true);
    try {
      const first = app.send('h2-taken-back');
      await until(() => app.effects.timedOut === 1);
      app.provider.open();
      expect((await first).status).toBe(201);
      const retry = await app.send('h2-taken-back');
      expect(retry.status).toBe(201);
      expect(retry.replayed).toBe('true');
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });
});
