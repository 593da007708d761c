// Routes that share a method and URL but not their constraints (Fastify's `constraints: { host }`
// or `{ version }`) are different endpoints with different handlers: per-tenant subdomains, or two
// API versions chosen by `Accept-Version`. The plugin names the operation by the route template
// (`request.routeOptions.url`), which holds no constraint, and the fingerprint holds no Host.
import { expect, it } from 'vitest';
import { app } from './support.js';

// Was wrong: `POST /charges` on host a.example and on host b.example was one operation with one
// fingerprint, so the caller's key sent to b.example after a.example was answered with a.example's
// stored response (replayed, 201) and b's handler never ran: a key replayed a response from another
// endpoint. The plugin notes each route's constraints when it is added and names the operation
// with them.
it('two routes on one URL with different host constraints keep their records apart', async () => {
  const operations: string[] = [];
  const onEvent = (event: { type: string; operation?: string }) => {
    if (event.type === 'claim' && event.operation) operations.push(event.operation);
  };
  const instance = await app({ onEvent }, (routes) => {
    for (const host of ['a.example', 'b.example']) {
      routes.post('/charges', { constraints: { host } }, async (_request, reply) => reply.code(201).send({ host }));
    }
  });
  try {
    const post = (host: string) =>
      instance.inject({
        method: 'POST',
        url: '/charges',
        headers: { host, 'content-type': 'application/json', 'idempotency-key': 'host-1' },
        payload: '{"amount":1}',
      });
    const first = await post('a.example');
    expect(first.statusCode).toBe(201);
    expect(first.json()).toEqual({ host: 'a.example' });
    const other = await post('b.example');
    expect(other.headers['idempotent-replayed']).toBeUndefined();
    expect(other.json()).toEqual({ host: 'b.example' });
  } finally {
    await instance.close();
  }
  expect(operations).toEqual(['POST /charges [host: a.example]', 'POST /charges [host: b.example]']);
});

it('names a version constraint, and leaves routes without constraints as they were', async () => {
  const operations: string[] = [];
  const onEvent = (event: { type: string; operation?: string }) => {
    if (event.type === 'claim' && event.operation) operations.push(event.operation);
  };
  const instance = await app({ onEvent }, (routes) => {
    for (const version of ['1.0.0', '2.0.0']) {
      routes.post('/charges', { constraints: { version } }, async (_request, reply) =>
        reply.code(201).send({ version }),
      );
    }
    routes.post('/refunds', async (_request, reply) => reply.code(201).send({}));
  });
  try {
    const post = (url: string, headers: Record<string, string>) =>
      instance.inject({
        method: 'POST',
        url,
        headers: { ...headers, 'content-type': 'application/json', 'idempotency-key': 'version-1' },
        payload: '{"amount":1}',
      });
    expect((await post('/charges', { 'accept-version': '1.x' })).json()).toEqual({ version: '1.0.0' });
    const other = await post('/charges', { 'accept-version': '2.x' });
    expect(other.headers['idempotent-replayed']).toBeUndefined();
    expect(other.json()).toEqual({ version: '2.0.0' });
    expect((await post('/refunds', {})).statusCode).toBe(201);
  } finally {
    await instance.close();
  }
  expect(operations).toEqual(['POST /charges [version: 1.0.0]', 'POST /charges [version: 2.0.0]', 'POST /refunds']);
});
