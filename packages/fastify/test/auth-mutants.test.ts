import { memoryStore } from '@idem/core';
import { createGuard, requireScopes } from '@idem/guard';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, authPlugin, guard } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

// `guard(edge, { optional: true })` where the shared table cannot tell: a guard whose challenge is
// not the default one (its own realm and RFC 9728 metadata), so an answer built without the guard
// shows; an idempotency plugin with a scope of its own, which needs no caller; and glue options
// checked when the hook is made.

const METADATA = 'https://api.example/.well-known/oauth-protected-resource';
const CHALLENGE = `Bearer realm="shop", resource_metadata="${METADATA}"`;

describe('Fastify guard(edge, { optional: true }) with a guard of its own realm', () => {
  const edge = createGuard({
    audience: AUDIENCE,
    realm: 'shop',
    resourceMetadata: METADATA,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  const optional = guard(edge, { optional: true });
  let runs = 0;
  let app: FastifyInstance;

  beforeAll(async () => {
    app = Fastify();
    await app.register(authPlugin);
    app.get('/read', { onRequest: [optional, authorize(requireScopes('orders:read'))] }, async () => ({ ok: true }));
    await app.register(async (scope) => {
      await scope.register(idempotency, { store: memoryStore() });
      scope.post('/charge', { onRequest: optional }, async (_request, reply) => reply.code(201).send({ n: ++runs }));
    });
    // A scope of its own: keys are scoped by it, so an anonymous write has all it needs.
    await app.register(async (scope) => {
      await scope.register(idempotency, { store: memoryStore(), scope: () => 'everyone' });
      scope.post('/scoped-charge', { onRequest: optional }, async (request, reply) =>
        reply.code(201).send({ n: ++runs, sub: request.auth?.sub ?? null }),
      );
    });
    await app.ready();
  });
  afterAll(() => app.close());

  it("authorize() answers an anonymous request with this guard's challenge (its realm and metadata), not a default one", async () => {
    const reply = await app.inject({ method: 'GET', url: '/read' });
    expect(reply.statusCode).toBe(401);
    expect(reply.headers['www-authenticate']).toBe(CHALLENGE);
    expect(reply.json()).toMatchObject({ code: 'token_missing' });
    const token = makeToken({ now: Date.now() });
    const allowed = await app.inject({ method: 'GET', url: '/read', headers: { authorization: `Bearer ${token}` } });
    expect(allowed.statusCode).toBe(200);
  });

  it("the idempotency plugin with the default scope answers an anonymous write with this guard's challenge; the handler never runs", async () => {
    const before = runs;
    const reply = await app.inject({ method: 'POST', url: '/charge', headers: { 'idempotency-key': 'anon-1' } });
    expect(reply.statusCode).toBe(401);
    expect(reply.headers['www-authenticate']).toBe(CHALLENGE);
    expect(reply.json()).toMatchObject({ code: 'token_missing' });
    expect(runs).toBe(before);
  });

  it('with a scope of its own, the idempotency plugin serves an anonymous write and replays it', async () => {
    const post = () => app.inject({ method: 'POST', url: '/scoped-charge', headers: { 'idempotency-key': 'anon-2' } });
    const first = await post();
    expect(first.statusCode).toBe(201);
    expect(first.json()).toMatchObject({ sub: null });
    const again = await post();
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);
  });

  it('an anonymous request whose auth was decorated as null is anonymous too', async () => {
    // A user's own `decorateRequest('auth', null)` (Fastify's advice for reference-free defaults).
    const own = Fastify();
    // Our declaration types `auth` as a principal or undefined; a user's plain JavaScript does not.
    own.decorateRequest('auth', null as never);
    await own.register(async (scope) => {
      await scope.register(idempotency, { store: memoryStore() });
      scope.post('/charge', { onRequest: optional }, async (_request, reply) => reply.code(201).send({ ok: true }));
    });
    try {
      const reply = await own.inject({ method: 'POST', url: '/charge', headers: { 'idempotency-key': 'anon-3' } });
      expect(reply.statusCode).toBe(401);
      expect(reply.headers['www-authenticate']).toBe(CHALLENGE);
    } finally {
      await own.close();
    }
  });

  it('bad glue options are a TypeError when the hook is made, not a guard that is silently required', () => {
    expect(() => guard(edge, { optional: 'yes' as never })).toThrow(/optional must be a boolean/);
    expect(() => guard(edge, true as never)).toThrow(TypeError);
    expect(() => guard(edge, null as never)).toThrow(TypeError);
  });
});
