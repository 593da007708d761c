import { once } from 'node:events';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createClient, isRequestFailedError } from '@idem/client';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { afterEach, describe, expect, it } from 'vitest';
import { fakeTime, seededRandom } from './support/fake-time.js';

const servers: Server[] = [];

afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(async (server) => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    }),
  );
});

/**
 * An Express app with @idem/express in front of `POST /charges`. With `dropFirstResponse`, the first
 * response is dropped after the handler ran: a middleware mounted before idempotency() destroys the socket instead of
 * sending, so the outcome is stored but the client never hears it.
 */
async function startApp({ dropFirstResponse }: { dropFirstResponse: boolean }) {
  const charges: unknown[] = [];
  const keys: Array<string | undefined> = [];
  let completions = 0;
  const waiters: Array<() => void> = [];
  const completed = (n: number) =>
    new Promise<void>((resolve) => {
      const check = () => (completions >= n ? resolve() : waiters.push(check));
      check();
    });
  let dropNext = dropFirstResponse;
  const app = express();
  app.post(
    '/charges',
    (req, res, next) => {
      keys.push(req.get('idempotency-key'));
      if (dropNext) {
        dropNext = false;
        res.end = (() => {
          res.socket?.destroy();
          return res;
        }) as typeof res.end;
      }
      next();
    },
    idempotency({
      store: memoryStore(),
      scope: (req) =>
        req
          .get('authorization')
          ?.replace(/^Bearer /, '')
          .split('.')[0],
      onEvent: (event) => {
        if (event.type === 'complete') {
          completions++;
          for (const wake of waiters.splice(0)) wake();
        }
      },
    }),
    express.json(),
    (req, res) => {
      const charge = { id: `ch_${charges.length + 1}`, amount: req.body.amount };
      charges.push(charge);
      res.status(201).location(`/charges/${charge.id}`).json(charge);
    },
  );
  const server = app.listen(0, '127.0.0.1');
  servers.push(server);
  await once(server, 'listening');
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, charges, keys, completed };
}

describe('through @idem/express', () => {
  it('a dropped response is retried with the same key and replayed by the adapter: one charge', async () => {
    const app = await startApp({ dropFirstResponse: true });
    const time = fakeTime();
    // Wait (in fake time) until the adapter has stored the first outcome, so the retry finds it.
    time.onSleep(() => app.completed(1));
    const client = createClient({
      baseUrl: app.url,
      getToken: () => 'user-1.t',
      random: seededRandom(4),
      sleep: time.sleep,
      now: time.now,
    });
    const result = await client.post<{ id: string; amount: number }>('/charges', { amount: 250 });
    expect(result.attempts.map((a) => a.outcome)).toEqual(['network-error', 'response']);
    expect(result.status).toBe(201);
    expect(result.replayed).toBe(true);
    expect(result.body).toEqual({ id: 'ch_1', amount: 250 });
    expect(result.headers.get('location')).toBe('/charges/ch_1');
    expect(app.keys).toEqual([`"${result.key}"`, `"${result.key}"`]);
    expect(app.charges).toHaveLength(1);
  });

  it('a 422 from the adapter is not retried', async () => {
    const app = await startApp({ dropFirstResponse: false });
    const time = fakeTime();
    const client = createClient({ baseUrl: app.url, getToken: () => 'user-1.t', sleep: time.sleep, now: time.now });
    await client.post('/charges', { amount: 1 }, { idempotencyKey: 'same-key' });
    const error = await client.post('/charges', { amount: 2 }, { idempotencyKey: 'same-key' }).catch((e: unknown) => e);
    expect(isRequestFailedError(error)).toBe(true);
    if (!isRequestFailedError(error)) return;
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(422);
    expect(error.attempts).toHaveLength(1);
    expect(time.waits).toEqual([]);
    expect(error.body).toMatchObject({ status: 422, retryable: false });
    expect(app.charges).toHaveLength(1);
  });
});
