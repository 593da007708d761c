// A client that leaves while its claim waits on a slow store: as in Express and Fastify, the handler
// is not started for nobody (a body parser below may skip a request whose socket is gone), and the
// key is released so the retry runs as the first attempt would have.
import type { IdempotencyEvent } from '@idem/core';
import Koa from 'koa';
import { it } from 'vitest';
import { leaveDuringClaim } from '../../core/test/support/client-gone.js';
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
  try {
    await leaveDuringClaim(server, gated, events, runs);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
