// A keyed request no route takes: the plugin claims nothing (Express and Koa claim and release), but
// the answer is still one to a keyed write, so it says `Cache-Control: no-store` as theirs does.
import { expect, it } from 'vitest';
import { app } from './support.js';

const keyed = { 'idempotency-key': 'nf-1', 'content-type': 'application/json' };

it("a not-found handler's own Cache-Control wins; without one the 404 says no-store", async () => {
  const instance = await app({}, (a) => {
    a.post('/charges', async () => ({ id: 'ch_1' }));
    a.setNotFoundHandler((request, reply) => {
      if (request.url === '/cached') reply.header('cache-control', 'public, max-age=60');
      return reply.code(404).send({ error: 'not_found' });
    });
  });
  try {
    const plain = await instance.inject({ method: 'POST', url: '/nowhere', headers: keyed, payload: '{}' });
    expect(plain.statusCode).toBe(404);
    expect(plain.headers['cache-control']).toBe('no-store');
    expect(plain.headers['idempotency-key']).toBeUndefined();
    const own = await instance.inject({ method: 'POST', url: '/cached', headers: keyed, payload: '{}' });
    expect(own.headers['cache-control']).toBe('public, max-age=60');
    // A method the plugin does not cover is Fastify's alone, key or not.
    const get = await instance.inject({ method: 'GET', url: '/nowhere', headers: { 'idempotency-key': 'nf-2' } });
    expect(get.statusCode).toBe(404);
    expect(get.headers['cache-control']).toBeUndefined();
  } finally {
    await instance.close();
  }
});
