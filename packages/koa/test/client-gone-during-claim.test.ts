// A client that leaves while its claim waits on a slow store: as in Express and Fastify, the handler
// is not started for nobody (a body parser below may skip a request whose socket is gone), and the
// key is released so the retry runs as the first attempt would have.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, recordId } from '@idem/core';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { gatedStore } from '../../core/test/support/gated-store.js';
import { idempotency } from '../src/idempotency.js';

const { bodyParser } = (await import('@koa/bodyparser' as string)) as { bodyParser: () => Koa.Middleware };

it('a client gone while its claim waited: no handler runs, the key is released, the retry runs', async () => {
  const gated = gatedStore();
  const events: IdempotencyEvent[] = [];
  const runs: unknown[] = [];
  const app = new Koa();
  app.use(idempotency({ store: gated.store, scope: () => 'tenant-1', onEvent: (e) => events.push(e) }));
  app.use(bodyParser());
  app.use((ctx) => {
    runs.push((ctx.request as { body?: unknown }).body);
    ctx.status = 201;
    ctx.body = { ok: true };
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const closed = new Promise<void>((resolve) => server.once('connection', (socket) => socket.once('close', resolve)));
  try {
    const body = JSON.stringify({ amount: 1000 });
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone', 'content-type': 'application/json', 'content-length': String(body.length) },
    });
    req.on('error', () => undefined);
    req.end(body);
    await gated.claiming;
    req.destroy();
    await closed;
    gated.open();
    await expect.poll(() => events.map((event) => event.type)).toEqual(['claim', 'release']);
    expect(runs).toEqual([]);
    expect(await gated.inner.get(recordId('tenant-1', 'POST /charges', 'gone'))).toBeUndefined();
    const retry = await fetch(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone', 'content-type': 'application/json' },
      body,
    });
    expect(retry.status).toBe(201);
    expect(runs).toEqual([{ amount: 1000 }]);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
