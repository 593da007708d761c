// A handler's own reason phrase (`reply.raw.statusMessage`): idem's 500 in place of a refused COMMIT
// must not go out with it (the shared scenario: replaced-status-line-kit.ts).
import { idempotency } from '@idem/fastify';
import type { PostgresTransaction } from '@idem/postgres';
import Fastify from 'fastify';
import { describeReplacedStatusLine } from '../../core/test/support/replaced-status-line-kit.js';

await describeReplacedStatusLine('fastify', 'Created Fine', async ({ store, reason, work }) => {
  const app = Fastify();
  await app.register(idempotency, { store, transactional: true, scope: () => 'user-1', storeTimeout: '15s' });
  app.post('/charges', async (request, reply) => {
    await work(request.idempotency?.tx as PostgresTransaction, String(request.headers['idempotency-key']));
    reply.raw.statusMessage = reason;
    return reply.code(201).send({ ok: true });
  });
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, close: () => app.close() };
});
