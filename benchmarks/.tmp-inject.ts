import { randomUUID } from 'node:crypto';
import Fastify from 'fastify';
import { memoryStore } from '../packages/core/src/index.ts';
import { idempotency } from '../packages/fastify/src/idempotency.ts';

const make = async (mode: string) => {
  const app = Fastify();
  if (mode !== 'bare')
    await app.register(idempotency, {
      store: memoryStore({ maxEntries: 5_000_000 }),
      scope: () => 'b',
      heartbeat: false,
    });
  app.post('/charges', async (request, reply) =>
    reply.code(201).send({ id: 'x', amount: (request.body as any).amount }),
  );
  await app.ready();
  return app;
};
const N = 20000;
for (const mode of ['bare', 'fresh', 'replay', 'bare', 'fresh', 'replay']) {
  const app = await make(mode);
  const run = (i: number) =>
    app.inject({
      method: 'POST',
      url: '/charges',
      payload: '{"amount":1}',
      headers: {
        'content-type': 'application/json',
        ...(mode === 'bare' ? {} : { 'idempotency-key': mode === 'fresh' ? randomUUID() : 'rk' }),
      },
    });
  for (let i = 0; i < 2000; i++) await run(i);
  const s = performance.now();
  for (let i = 0; i < N; i++) {
    const r = await run(i);
    if (r.statusCode !== 201) throw new Error(String(r.statusCode) + r.body);
  }
  console.log(mode.padEnd(7), (((performance.now() - s) * 1000) / N).toFixed(1), 'µs/req');
  await app.close();
}
