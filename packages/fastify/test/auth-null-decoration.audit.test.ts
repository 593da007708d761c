import { createGuard, requireScopes } from '@idem/guard';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, guard } from '../src/auth.js';

// Mutation pass: Fastify's own docs decorate a request with `null` (`decorateRequest('auth', null)`),
// so an app that declared `auth` itself has `null`, not `undefined`, on a request nobody authenticated.

describe('authorize() on an app that decorated `auth` with null', () => {
  it('answers 401 to a request an optional guard let through without credentials', async () => {
    const app = Fastify();
    // This package types `auth` as `Principal | undefined`; a JavaScript app (or one typed before it) sets null.
    app.decorateRequest('auth', null as unknown as undefined);
    const edge = createGuard({
      audience: AUDIENCE,
      issuers: [{ issuer: ISSUER, secret: SECRET, algorithms: ['HS256'] }],
    });
    let ran = false;
    app.get(
      '/orders',
      { onRequest: [guard(edge, { optional: true }), authorize(requireScopes('orders:read'))] },
      async () => {
        ran = true;
        return { ok: true };
      },
    );
    try {
      const response = await app.inject({ method: 'GET', url: '/orders' });
      expect(response.statusCode).toBe(401);
      expect(response.json().code).toBe('token_missing');
      expect(ran).toBe(false);
    } finally {
      await app.close();
    }
  });
});
