// The guard: an unguarded GET, the idem guard with its verified-token cache answering (one repeated
// token) and with the cache off (every request verifies a signature) for HS256, RS256, ES256 and
// EdDSA, beside raw jose.jwtVerify in the same Fastify route (the verify path's baseline), @fastify/jwt,
// and raw jose.jwtVerify in a process of its own without HTTP (for reference); and on Express, RS256
// from a JWKS endpoint beside express-oauth2-jwt-bearer and express-jwt with jwks-rsa.
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { exportJWK, exportSPKI, generateKeyPair, SignJWT } from 'jose';
import { measureLoop, measureServer } from '../lib/measure-http.mjs';
import { runGroup } from '../lib/rounds.mjs';

const issuer = 'https://id.bench.example';
const audience = 'https://api.bench.example';
const secret = 'bench-hs256-secret-that-is-long-enough-0123456789';
/** The algorithms of issue 5's guard rows, in the order the page lists them. */
export const guardAlgorithms = ['HS256', 'RS256', 'ES256', 'EdDSA'];

/** Contender names, shared with the targets. */
export const guardRow = {
  unguarded: 'unguarded',
  cached: (alg) => `idem guard ${alg}, cached (one repeated token)`,
  uncached: (alg) => `idem guard ${alg}, uncached (distinct tokens)`,
  joseInRoute: (alg) => `raw jose.jwtVerify ${alg} in the same Fastify route (distinct tokens)`,
  fastifyJwt: (alg) => `@fastify/jwt ${alg} (distinct tokens)`,
  jose: (alg) => `raw jose.jwtVerify ${alg}, 64 in flight, no HTTP`,
  oauth2Bearer: 'express-oauth2-jwt-bearer RS256 via JWKS (distinct tokens)',
  expressJwt: 'express-jwt + jwks-rsa RS256 via JWKS (distinct tokens)',
  idemJwksCached: 'idem guard RS256 via JWKS, cached (one repeated token)',
  idemJwksUncached: 'idem guard RS256 via JWKS, uncached (distinct tokens)',
};

// Key pair, public forms and `count` distinct access tokens (RFC 9068 `at+jwt`) for one algorithm.
// Only public keys get a `kid`: the idem guard refuses a token naming a key it does not have.
async function material(alg, count) {
  const kid = `bench-${alg.toLowerCase()}`;
  let signingKey;
  let publicJwk;
  let publicPem;
  if (alg === 'HS256') {
    signingKey = new TextEncoder().encode(secret);
  } else {
    const pair = await generateKeyPair(alg, { extractable: true, ...(alg === 'EdDSA' ? { crv: 'Ed25519' } : {}) });
    signingKey = pair.privateKey;
    publicJwk = { ...(await exportJWK(pair.publicKey)), kid, alg, use: 'sig' };
    publicPem = await exportSPKI(pair.publicKey);
  }
  const now = Math.floor(Date.now() / 1000);
  const tokens = [];
  for (let i = 0; i < count; i++) {
    tokens.push(
      await new SignJWT({ scope: 'orders:read', client_id: 'bench' })
        .setProtectedHeader({ alg, typ: 'at+jwt', ...(alg === 'HS256' ? {} : { kid }) })
        .setIssuer(issuer)
        .setAudience(audience)
        .setSubject(`user-${i % 100}`)
        .setJti(randomUUID())
        .setIssuedAt(now)
        .setExpirationTime(now + 3_600)
        .sign(signingKey),
    );
  }
  return { alg, secret, publicJwk, publicPem, tokens, issuer, audience };
}

// A JWKS endpoint in the runner's process, fetched once per verifier and then cached by each.
async function jwksEndpoint(keys) {
  const body = JSON.stringify({ keys });
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=3600' });
    res.end(body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { uri: `http://127.0.0.1:${server.address().port}/.well-known/jwks.json`, close: () => server.close() };
}

/**
 * The guard suite: one group on Fastify (every algorithm), one on Express (RS256 via JWKS).
 *
 * @example
 * const { groups } = await guardSuite.run(settings, context);
 */
export const guardSuite = {
  id: 'guard',
  title: 'Guard: unguarded, cached, uncached, peers, raw jose',
  async run(settings, context) {
    const count = settings.quick ? 200 : 2_000;
    const algorithms = settings.quick ? ['HS256'] : guardAlgorithms;
    const keys = {};
    for (const alg of new Set([...algorithms, 'RS256'])) keys[alg] = await material(alg, count);
    const get = (tokens) => ({ pattern: 'tokens', method: 'GET', path: '/orders', tokens });
    const server = (framework, variant, key, extra = {}) => ({
      kind: 'guarded',
      framework,
      variant,
      ...key,
      tokens: undefined,
      ...extra,
    });
    const groups = [];

    const fastify = [
      {
        name: guardRow.unguarded,
        quick: true,
        measure: () => measureServer(server('fastify', 'unguarded', keys.HS256), get(keys.HS256.tokens), settings),
      },
    ];
    for (const alg of algorithms) {
      const key = keys[alg];
      fastify.push(
        {
          name: guardRow.cached(alg),
          quick: true,
          measure: () => measureServer(server('fastify', 'idem', key, { cache: true }), get([key.tokens[0]]), settings),
        },
        {
          name: guardRow.uncached(alg),
          quick: true,
          measure: () => measureServer(server('fastify', 'idem', key, { cache: false }), get(key.tokens), settings),
        },
        {
          name: guardRow.joseInRoute(alg),
          quick: true,
          measure: () => measureServer(server('fastify', 'jose', key), get(key.tokens), settings),
        },
        {
          name: guardRow.fastifyJwt(alg),
          quick: true,
          measure: () => measureServer(server('fastify', 'fastify-jwt', key), get(key.tokens), settings),
        },
        {
          name: guardRow.jose(alg),
          quick: true,
          measure: () => measureLoop({ kind: 'jose', ...key, inFlight: 64 }, settings),
        },
      );
    }
    groups.push(
      await runGroup(
        {
          id: 'guard-fastify',
          title: 'Guard on Fastify: GET /orders',
          unit: 'req/s',
          baseline: guardRow.unguarded,
          note:
            'Requests per second, except the "no HTTP" rows: jwtVerify calls per second in a process of their own, 64 in flight, for reference only ' +
            '(a Fastify request alone costs more than an HS256 verification, so the verify-path targets compare with the in-route rows). ' +
            `"Uncached" cycles through ${count} distinct tokens with the idem guard's cache turned off; the "in the same Fastify route" rows are an onRequest hook ` +
            'calling jose.jwtVerify (key imported once, issuer, audience and algorithm pinned, no cache) on the same tokens; @fastify/jwt runs with its default (no cache).',
          contenders: fastify,
        },
        settings,
        context.log,
      ),
    );

    const jwks = await jwksEndpoint([keys.RS256.publicJwk]);
    try {
      const rs = { ...keys.RS256, jwksUri: jwks.uri };
      groups.push(
        await runGroup(
          {
            id: 'guard-express',
            title: 'Guard on Express: GET /orders, RS256 keys from a JWKS endpoint',
            unit: 'req/s',
            baseline: guardRow.unguarded,
            note: 'Every verifier fetches the JWKS once and caches it. Peers verify every request (neither caches verified tokens).',
            contenders: [
              {
                name: guardRow.unguarded,
                quick: true,
                measure: () => measureServer(server('express', 'unguarded', rs), get(rs.tokens), settings),
              },
              {
                name: guardRow.idemJwksCached,
                measure: () =>
                  measureServer(server('express', 'idem', rs, { cache: true }), get([rs.tokens[0]]), settings),
              },
              {
                name: guardRow.idemJwksUncached,
                measure: () => measureServer(server('express', 'idem', rs, { cache: false }), get(rs.tokens), settings),
              },
              {
                name: guardRow.oauth2Bearer,
                quick: true,
                measure: () =>
                  measureServer(server('express', 'express-oauth2-jwt-bearer', rs), get(rs.tokens), settings),
              },
              {
                name: guardRow.expressJwt,
                measure: () => measureServer(server('express', 'express-jwt', rs), get(rs.tokens), settings),
              },
            ],
          },
          settings,
          context.log,
        ),
      );
    } finally {
      jwks.close();
    }
    return { groups };
  },
};
