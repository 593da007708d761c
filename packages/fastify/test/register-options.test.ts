import { memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';

describe('plugin options', () => {
  it("takes Fastify's own register options beside its own (Fastify hands them to the plugin too)", async () => {
    const app = Fastify();
    await app.register(idempotency, {
      store: memoryStore(),
      scope: () => 'demo',
      prefix: '/v1',
      logLevel: 'warn',
      logSerializers: {},
    } as never);
    app.post('/charges', async (_request, reply) => reply.code(201).send({ id: 'ch_1' }));
    const answer = await app.inject({ method: 'POST', url: '/charges', headers: { 'idempotency-key': 'k-1' } });
    expect(answer.statusCode).toBe(201);
    await app.close();
  });

  it('refuses a misspelt option at registration, naming the one meant', async () => {
    const app = Fastify();
    await expect(
      app.register(idempotency, { store: memoryStore(), scope: () => 'demo', retension: '7d' } as never),
    ).rejects.toThrow('idempotency: unknown option "retension" (did you mean "retention"?)');
  });
});
