// The Fastify plugin's anonymous-request check: behaviours that mutation testing of
// packages/fastify/src/idempotency.ts showed no test held.
import { memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { captureWarnings } from '../../core/test/support/warnings.js';
import { AUDIENCE, ISSUER, SECRET } from '../../guard/test/support/tokens.js';
import { authPlugin, guard } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

describe('an anonymous write to a route with a scope of its own (config.idempotency.scope)', () => {
  it("is served and replayed under the route's scope, though the plugin has none: no 401", async () => {
    const edge = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    const optional = guard(edge, { optional: true });
    const app = Fastify();
    let runs = 0;
    await app.register(authPlugin);
    await app.register(idempotency, { store: memoryStore() });
    // The route's scope overrides the plugin's (none here): the check must ask the route's.
    app.post(
      '/charge',
      { onRequest: optional, config: { idempotency: { scope: () => 'everyone' } } },
      async (_request, reply) => reply.code(201).send({ n: ++runs }),
    );
    // Without one, the same anonymous write is the guard's 401.
    app.post('/other', { onRequest: optional }, async (_request, reply) => reply.code(201).send({ n: ++runs }));
    await app.ready();
    try {
      const post = (url: string) => app.inject({ method: 'POST', url, headers: { 'idempotency-key': 'anon-route' } });
      const first = await post('/charge');
      expect(first.statusCode).toBe(201);
      const again = await post('/charge');
      expect([again.statusCode, again.headers['idempotent-replayed']]).toEqual([201, 'true']);
      expect(runs).toBe(1);
      const other = await post('/other');
      expect([other.statusCode, other.json().code]).toEqual([401, 'token_missing']);
      expect(runs).toBe(1);
    } finally {
      await app.close();
    }
  });
});

describe('an anonymous write through two registrations on one route', () => {
  it('the first registration governs: its scope serves the write, the second (no scope) steps aside', async () => {
    const edge = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    const optional = guard(edge, { optional: true });
    const app = Fastify();
    let runs = 0;
    await app.register(authPlugin);
    await app.register(idempotency, { store: memoryStore(), scope: () => 'everyone' });
    await app.register(async (child) => {
      // Its settings do not apply to a request the root registration claimed: no 401 of its own.
      await child.register(idempotency, { store: memoryStore() });
      child.post('/charges', { onRequest: optional }, async (_request, reply) => reply.code(201).send({ n: ++runs }));
    });
    await app.ready();
    const warnings = captureWarnings();
    try {
      const post = () =>
        app.inject({ method: 'POST', url: '/charges', headers: { 'idempotency-key': 'anon-stacked' } });
      expect((await post()).statusCode).toBe(201);
      const again = await post();
      expect([again.statusCode, again.headers['idempotent-replayed']]).toEqual([201, 'true']);
      expect(runs).toBe(1);
    } finally {
      warnings.stop();
      await app.close();
    }
  });
});
