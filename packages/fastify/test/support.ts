// What the Fastify test files share.
import { memoryStore } from '@idem/core';
import { type FastifyIdempotencyOptions, idempotency } from '@idem/fastify';
import Fastify, { type FastifyInstance } from 'fastify';

/** A ready Fastify instance with the plugin (memory store, one tenant) and the routes `routes` adds. */
export async function app(options: Partial<FastifyIdempotencyOptions>, routes: (app: FastifyInstance) => void) {
  const instance = Fastify();
  await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', ...options });
  routes(instance);
  await instance.ready();
  return instance;
}
