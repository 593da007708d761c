// GET /orders on Fastify or Express: unguarded, behind the idem guard (verified-token cache on or
// off), behind a hand-written jose.jwtVerify hook (the verify path's baseline), or behind a peer:
// @fastify/jwt (fast-jwt) on Fastify, express-oauth2-jwt-bearer and express-jwt with jwks-rsa on
// Express. Every guard checks the same things: signature, algorithm, iss, aud, exp.
import { joseKey } from '../lib/jose-key.mjs';
import { nodeServer } from './charges.mjs';

/**
 * Builds and starts the app of `spec` on an ephemeral loopback port.
 * `spec`: `{ framework, variant, alg, issuer, audience, secret?, publicPem?, publicJwk?, jwksUri?, cache? }`.
 *
 * @example
 * const { port, close } = await startGuarded({ framework: 'fastify', variant: 'unguarded' });
 */
export async function startGuarded(spec) {
  if (spec.framework === 'fastify') return startFastify(spec);
  if (spec.framework === 'express') return startExpress(spec);
  throw new TypeError(`unknown framework ${spec.framework}`);
}

// The idem guard's issuer entry: a secret, a pinned public key, or the JWKS URL, like the peer beside it.
function idemGuardOptions(spec) {
  let issuer;
  if (spec.alg === 'HS256') issuer = { issuer: spec.issuer, secret: spec.secret };
  else if (spec.jwksUri) issuer = { issuer: spec.issuer, jwksUri: spec.jwksUri, algorithms: [spec.alg] };
  else issuer = { issuer: spec.issuer, publicKeys: [{ ...spec.publicJwk, alg: spec.alg }], algorithms: [spec.alg] };
  return { audience: spec.audience, issuers: [issuer], cache: spec.cache ? { maxEntries: 10_000 } : false };
}

async function startFastify(spec) {
  const Fastify = (await import('fastify')).default;
  const app = Fastify();
  if (spec.variant === 'idem') {
    const { authPlugin, guard } = await import('@idem/fastify');
    await app.register(authPlugin);
    app.addHook('onRequest', guard(idemGuardOptions(spec)));
  } else if (spec.variant === 'jose') {
    // The same `request.auth` decoration as authPlugin, so both requests keep one shape.
    app.decorateRequest('auth', undefined);
    app.addHook('onRequest', await joseHook(spec));
  } else if (spec.variant === 'fastify-jwt') {
    const jwt = (await import('@fastify/jwt')).default;
    const key = spec.alg === 'HS256' ? spec.secret : spec.publicPem;
    await app.register(jwt, {
      // Verification only: fast-jwt gets the public key (or the shared secret) and nothing to sign with.
      secret: spec.alg === 'HS256' ? key : { public: key, private: 'unused' },
      verify: { algorithms: [spec.alg], allowedIss: spec.issuer, allowedAud: spec.audience },
    });
    app.addHook('onRequest', async (request, reply) => {
      try {
        await request.jwtVerify();
      } catch {
        return reply.code(401).send({ error: 'invalid_token' });
      }
    });
  } else if (spec.variant !== 'unguarded') {
    throw new TypeError(`unknown Fastify guard variant ${spec.variant}`);
  }
  app.get('/orders', async () => ({ orders: [], ok: true }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { port: app.server.address().port, close: () => app.close() };
}

// What a developer writes by hand with jose: the key imported once at start, then jwtVerify on every
// request's bearer token with issuer, audience and the one algorithm pinned, and no cache. The idem
// guard's verify path is measured against this hook, on the same server setup, so the ratio is the
// guard's own cost over jose's and not the cost of an HTTP request.
async function joseHook(spec) {
  const { jwtVerify } = await import('jose');
  const key = await joseKey(spec);
  const options = { issuer: spec.issuer, audience: spec.audience, algorithms: [spec.alg] };
  return async (request, reply) => {
    const header = request.headers.authorization;
    if (typeof header !== 'string' || !header.startsWith('Bearer ')) {
      return reply.code(401).send({ error: 'invalid_token' });
    }
    try {
      request.auth = (await jwtVerify(header.slice(7), key, options)).payload;
    } catch {
      return reply.code(401).send({ error: 'invalid_token' });
    }
  };
}

async function startExpress(spec) {
  const express = (await import('express')).default;
  const app = express();
  const handlers = [];
  if (spec.variant === 'idem') {
    const { guard } = await import('@idem/express');
    handlers.push(guard(idemGuardOptions(spec)));
  } else if (spec.variant === 'express-oauth2-jwt-bearer') {
    const { auth } = await import('express-oauth2-jwt-bearer');
    handlers.push(
      auth({ issuer: spec.issuer, audience: spec.audience, jwksUri: spec.jwksUri, tokenSigningAlg: spec.alg }),
    );
  } else if (spec.variant === 'express-jwt') {
    const { expressjwt } = await import('express-jwt');
    const jwksRsa = (await import('jwks-rsa')).default;
    handlers.push(
      expressjwt({
        secret: jwksRsa.expressJwtSecret({ jwksUri: spec.jwksUri, cache: true, rateLimit: false }),
        algorithms: [spec.alg],
        issuer: spec.issuer,
        audience: spec.audience,
      }),
    );
  } else if (spec.variant !== 'unguarded') {
    throw new TypeError(`unknown Express guard variant ${spec.variant}`);
  }
  app.get('/orders', ...handlers, (_req, res) => {
    res.json({ orders: [], ok: true });
  });
  // Peers throw their 401 errors to Express; the bench counts them as refused requests.
  app.use((error, _req, res, _next) => {
    res.status(error?.status ?? 500).json({ error: 'invalid_token' });
  });
  return nodeServer(app.listen(0, '127.0.0.1'));
}
