// What the Fastify test files share.
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { type FastifyIdempotencyOptions, idempotency } from '@idem/fastify';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';

/** A ready Fastify instance with the plugin (memory store, one tenant) and the routes `routes` adds. */
export async function app(options: Partial<FastifyIdempotencyOptions>, routes: (app: FastifyInstance) => void) {
  const instance = Fastify();
  await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', ...options });
  routes(instance);
  await instance.ready();
  return instance;
}

/** Listens on an ephemeral loopback port (a real socket, which app.inject lacks); returns the base URL. */
export async function listening(instance: FastifyInstance): Promise<string> {
  await instance.listen({ port: 0, host: '127.0.0.1' });
  return `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
}

/**
 * A client that leaves while the handler works: the handler awaits `untilGone(request)`, which tells
 * `running` it started and returns once the client's socket closed (the client: abandonedPost of
 * core/test/support/client-gone.ts); the handler calls `returned()` as it returns, and
 * `handlerReturned` resolves on the next turn, once Fastify has taken what it returned.
 */
export function clientLeaves() {
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let resolveReturned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    resolveReturned = resolve;
  });
  return {
    running,
    handlerReturned,
    async untilGone(request: FastifyRequest) {
      const gone = new Promise((resolve) => request.raw.socket.once('close', resolve));
      started();
      await gone;
    },
    returned: () => void setImmediate(resolveReturned),
  };
}
