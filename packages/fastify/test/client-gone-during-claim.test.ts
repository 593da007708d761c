// A client that leaves while its claim waits on a slow store: as in Express and Koa, the handler is
// not started for nobody, and the key is released so the retry runs as the first attempt would have.
import type { IdempotencyEvent } from '@idem/core';
import { idempotency } from '@idem/fastify';
import Fastify from 'fastify';
import { it } from 'vitest';
import { leaveDuringClaim } from '../../core/test/support/client-gone.js';
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
  try {
    await leaveDuringClaim(app.server, gated, events, runs);
  } finally {
    await app.close();
  }
});
