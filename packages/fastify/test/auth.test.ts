import { memoryStore } from '@idem/core';
import { requireRoles, requireScopes } from '@idem/guard';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { describeAuthGlue } from '../../guard/test/support/http-scenarios.js';
import { AUDIENCE, ISSUER, makeToken, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, authPlugin, forwardHeaders, guard, internalAuth } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

describeAuthGlue('Fastify', async ({ guard: edge, shopGuard, dpopGuard, nonceGuard, verifier, hit }) => {
  const app = Fastify();
  await app.register(authPlugin);
  const verify = guard(edge);
  const internal = internalAuth(verifier);
  app.route({
    method: ['GET', 'POST', 'OPTIONS'],
    url: '/protected',
    onRequest: verify,
    handler: async (request) => {
      hit('protected');
      return { sub: request.auth?.sub, scope: [...(request.auth?.scope ?? [])] };
    },
  });
  app.get('/write', { onRequest: [verify, authorize(requireScopes('orders:write'))] }, async () => {
    hit('write');
    return { ok: true };
  });
  app.get('/admin', { onRequest: [verify, authorize(requireRoles('admin'))] }, async () => {
    hit('admin');
    return { ok: true };
  });
  app.get('/forward', { onRequest: verify }, async (request) => {
    hit('forward');
    return forwardHeaders(request, { audience: 'orders' });
  });
  app.get('/internal', { onRequest: internal }, async (request) => {
    hit('internal');
    return { sub: request.auth?.sub, iss: request.auth?.iss, scope: [...(request.auth?.scope ?? [])] };
  });
  app.get('/internal-write', { onRequest: [internal, authorize(requireScopes('orders:write'))] }, async () => {
    hit('internal-write');
    return { ok: true };
  });
  app.get('/authorize-only', { onRequest: authorize(requireScopes('orders:read')) }, async () => {
    hit('authorize-only');
    return { ok: true };
  });
  app.route({
    method: ['GET', 'POST'],
    url: '/dpop',
    onRequest: guard(dpopGuard),
    handler: async (request) => {
      hit('dpop');
      return { sub: request.auth?.sub };
    },
  });
  const optional = guard(shopGuard, { optional: true });
  app.route({
    method: ['GET', 'POST'],
    url: '/optional',
    onRequest: optional,
    handler: async (request) => {
      hit('optional');
      return { sub: request.auth?.sub ?? null };
    },
  });
  app.get('/optional-read', { onRequest: [optional, authorize(requireScopes('orders:read'))] }, async () => {
    hit('optional-read');
    return { ok: true };
  });
  // The idempotency plugin in a scope of its own, so that it covers this route only.
  let charges = 0;
  await app.register(async (scope) => {
    await scope.register(idempotency, { store: memoryStore() });
    scope.post('/optional-charge', { onRequest: optional }, async (request, reply) => {
      hit('optional-charge');
      return reply.code(201).send({ sub: request.auth?.sub, n: ++charges });
    });
  });
  await app.register(async (scope) => {
    await scope.register(idempotency, { store: memoryStore(), scope: () => 'everyone' });
    scope.post('/optional-scoped-charge', { onRequest: optional }, async (request, reply) => {
      hit('optional-scoped-charge');
      return reply.code(201).send({ sub: request.auth?.sub ?? null, n: ++charges });
    });
  });
  app.route({
    method: ['GET', 'POST'],
    url: '/dpop-nonce',
    onRequest: guard(nonceGuard),
    handler: async (request) => {
      hit('dpop-nonce');
      return { sub: request.auth?.sub };
    },
  });
  app.route({
    method: ['GET', 'POST'],
    url: '/optional-dpop',
    onRequest: guard(dpopGuard, { optional: true }),
    handler: async (request) => {
      hit('optional-dpop');
      return { sub: request.auth?.sub ?? null };
    },
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const address = app.server.address() as { port: number };
  return { url: `http://127.0.0.1:${address.port}`, close: () => app.close() };
});

describe('Fastify authPlugin', () => {
  it('verifies every request of the instance when given a guard', async () => {
    const app = Fastify();
    await app.register(authPlugin, { guard: { audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] } });
    app.get('/x', async (request) => ({ sub: request.auth?.sub }));
    const refused = await app.inject({ method: 'GET', url: '/x' });
    expect(refused.statusCode).toBe(401);
    expect(refused.headers['www-authenticate']).toBe('Bearer realm="api"');
    const allowed = await app.inject({
      method: 'GET',
      url: '/x',
      headers: { authorization: `Bearer ${makeToken({ now: Date.now() })}` },
    });
    expect(allowed.json()).toEqual({ sub: 'user-1' });
    await app.close();
  });
});
