// A client that leaves while its claim waits on a slow store: as in Express and Koa, the handler is
// not started for nobody, and the key is released so the retry runs as the first attempt would have.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, recordId } from '@idem/core';
import { idempotency } from '@idem/fastify';
import Fastify from 'fastify';
import { expect, it } from 'vitest';
import { gatedStore } from '../../core/test/support/gated-store.js';

it('a client gone while its claim waited: no handler runs, the key is released, the retry runs', async () => {
  const gated = gatedStore();
  const events: IdempotencyEvent[] = [];
  const runs: unknown[] = [];
  const app = Fastify();
  await app.register(idempotency, { store: gated.store, scope: () => 'tenant-1', onEvent: (e) => events.push(e) });
  app.post('/charges', async (request, reply) => {
    runs.push(request.body);
    return reply.code(201).send({ ok: true });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  const closed = new Promise<void>((resolve) =>
    app.server.once('connection', (socket) => socket.once('close', resolve)),
  );
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
    await app.close();
  }
});
