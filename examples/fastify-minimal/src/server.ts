import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import Fastify from 'fastify';

const app = Fastify();
let count = 0;

// In production the guard sets request.auth, the default scope; here a demo caller header stands in,
// and a request without it is turned away first, as the guard turns away one without a token.
app.addHook('onRequest', async (request, reply) => {
  if (!request.headers['x-customer']) return reply.code(401).send({ error: 'send x-customer: <id>' });
});
await app.register(idempotency, {
  store: memoryStore(),
  scope: (request) => request.headers['x-customer']?.toString(),
});

app.post<{ Body: { amount: number } }>('/charges', async (request, reply) => {
  const id = `ch_${++count}`;
  return reply.code(201).header('location', `/charges/${id}`).send({ id, amount: request.body.amount });
});

const port = Number(process.env.PORT ?? 3000);
await app.listen({ port });
console.log(`fastify-minimal on http://localhost:${port}; send this twice:`);
console.log(
  `curl -i localhost:${port}/charges -H 'x-customer: c1' -H 'Idempotency-Key: k1' -H 'content-type: application/json' -d '{"amount":100}'`,
);
