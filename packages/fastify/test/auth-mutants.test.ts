import { memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, SECRET } from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

// What optional guards answer is the shared table's (describeAuthGlue); here, what only Fastify
// has: a request whose `auth` a user decorated as null, and the glue options, checked when the hook
// is made.

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
