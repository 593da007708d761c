import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { memoryStore } from '@idem/core';
import { authorize, forwardHeaders, guard, idempotency } from '@idem/express';
import { authPlugin, authorize as fastifyAuthorize, guard as fastifyGuard } from '@idem/fastify';
import { guard as koaGuard } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import { calculateJwkThumbprint, exportJWK, exportSPKI, generateKeyPair, type JWK, SignJWT } from 'jose';
import Koa from 'koa';
import { createClient as createRedisClient } from 'redis';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { listen as listenOn } from '../../core/test/support/timeouts-kit.js';
import {
  authorizeRequest,
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  forwardHeaders as forwardHeaders2,
  type GuardEvent,
  type GuardResult,
  type Principal,
  policy,
  requireAnyRole,
  requireAuthentication,
  requireRoles,
  requireScopes,
  verifyInternalToken,
} from '../src/index.js';

// Audit (branch audit-docsguard): the examples of docs/guard.md, docs/security.md and the guard
// section of docs/errors.md, run as written against tokens signed with jose, and the claims those
// pages make checked against what the guard does. `fetch` is the only thing replaced: the pages'
// URLs (id.example, orders.internal) are answered in process, so each example runs unchanged.

const ISSUER = 'https://id.example';
const AUDIENCE = 'https://api.example';
const JWKS_URI = 'https://id.example/.well-known/jwks.json';

let signingKey: CryptoKey;
let publicJwk: JWK;

beforeAll(async () => {
  const pair = await generateKeyPair('RS256', { extractable: true });
  signingKey = pair.privateKey;
  publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
});

const nowSeconds = () => Math.floor(Date.now() / 1000);

async function accessToken(
  claims: Record<string, unknown> = {},
  header: Record<string, unknown> = {},
  key: CryptoKey = signingKey,
) {
  // Defaults first, then the test's claims: `exp: past` or `client_id: undefined` (left out) win.
  const payload = JSON.parse(
    JSON.stringify({
      iss: ISSUER,
      sub: 'user-1',
      aud: AUDIENCE,
      iat: nowSeconds(),
      exp: nowSeconds() + 300,
      scope: 'orders:write',
      client_id: 'app-1',
      jti: crypto.randomUUID(),
      ...claims,
    }),
  ) as Record<string, unknown>;
  return new SignJWT(payload).setProtectedHeader({ alg: 'RS256', kid: 'k1', typ: 'at+jwt', ...header }).sign(key);
}

/** The pages' URLs, answered in process; anything else is a test bug. */
type Route = (request: Request) => Promise<Response> | Response;
function routeFetch(routes: Record<string, Route>) {
  const real = globalThis.fetch;
  const fake = async (input: string | URL | Request, init?: RequestInit) => {
    const request = new Request(input, init);
    const url = new URL(request.url);
    const route = routes[`${url.origin}${url.pathname}`];
    if (route !== undefined) return route(request);
    if (url.hostname === '127.0.0.1') return real(input, init);
    throw new Error(`unexpected fetch ${request.url}`);
  };
  vi.stubGlobal('fetch', fake);
}
afterEach(() => {
  vi.unstubAllGlobals();
});

const jwksRoute = (): Route => () => Response.json({ keys: [publicJwk] });

// An Express app on an ephemeral port (the timeout kit's listen, on the app's own server).
const listen = (app: express.Express) => listenOn(http.createServer(app));

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('docs/guard.md: the first example (Express gateway)', () => {
  it('runs as written: 401 and 403 as the page shows them, and the upstream gets only the internal token', async () => {
    let upstream: { headers: Record<string, string>; body: string } | undefined;
    routeFetch({
      [JWKS_URI]: jwksRoute(),
      'http://orders.internal/orders': async (request) => {
        const headers: Record<string, string> = {};
        request.headers.forEach((value, name) => {
          headers[name] = value;
        });
        upstream = { headers, body: await request.text() };
        return new Response('created', { status: 201 });
      },
    });
    // ---- the page's example, as written ----
    const internalTokens = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    const edge = createGuard({
      audience: 'https://api.example',
      issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/.well-known/jwks.json' }],
      internalTokens, // used by forwardHeaders()
    });

    const app = express();
    app.use(express.json());
    app.get('/.well-known/gateway-jwks.json', (_req, res) => {
      res.json(internalTokens.jwks());
    });
    app.post('/orders', guard(edge), authorize(requireScopes('orders:write')), async (req, res) => {
      const headers = await forwardHeaders(req, { audience: 'orders-service' });
      // The body is sent re-encoded below, so its length is fetch's to write.
      delete headers['content-length'];
      const upstream = await fetch('http://orders.internal/orders', {
        method: 'POST',
        headers,
        body: JSON.stringify(req.body),
      });
      res.status(upstream.status).send(await upstream.text());
    });
    // ---- end of the example ----
    const server = await listen(app);
    try {
      const post = (headers: Record<string, string>) =>
        fetch(`${server.url}/orders`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body: JSON.stringify({ amount: 100 }),
        });

      const missing = await post({});
      expect(missing.status).toBe(401);
      expect(missing.headers.get('www-authenticate')).toBe('Bearer realm="api"');
      expect(missing.headers.get('cache-control')).toBe('no-store');
      expect(missing.headers.get('content-type')).toBe('application/problem+json');
      expect(await missing.json()).toEqual({
        type: 'https://idem.dev/problems/token-missing',
        title: 'Authentication required',
        status: 401,
        detail: 'No bearer token was presented',
        code: 'token_missing',
        retryable: false,
      });

      const reader = await post({ authorization: `Bearer ${await accessToken({ scope: 'orders:read' })}` });
      expect(reader.status).toBe(403);
      expect(reader.headers.get('www-authenticate')).toBe(
        'Bearer realm="api", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:write"',
      );

      const ok = await post({
        authorization: `Bearer ${await accessToken()}`,
        'x-user-id': 'admin',
        X_User_Id: 'admin',
        'x-forwarded-for': '10.0.0.1',
      });
      expect(ok.status).toBe(201);
      expect(upstream?.body).toBe('{"amount":100}');
      const sent = upstream?.headers ?? {};
      expect(sent.authorization).toBeUndefined();
      expect(sent['x-user-id']).toBeUndefined();
      expect(sent['x-forwarded-for']).toBeUndefined();
      // The service behind verifies it with the JWKS the gateway serves, as "Behind the gateway" shows.
      const gatewayJwks = (await (await fetch(`${server.url}/.well-known/gateway-jwks.json`)).json()) as {
        keys: object[];
      };
      const once = await verifyInternalToken(sent['idem-internal-token'] as string, {
        issuer: 'https://gateway.example',
        audience: 'orders-service',
        jwks: gatewayJwks,
      });
      expect(once.ok && once.principal.sub).toBe('user-1');
      expect(once.ok && once.principal.iss).toBe(ISSUER);
    } finally {
      await server.close();
    }
  });
});

/** A guard on the page's issuer, with the JWKS answered in process. */
function pageGuard(extra: Partial<Parameters<typeof createGuard>[0]> = {}) {
  const events: GuardEvent[] = [];
  const edge = createGuard({
    audience: AUDIENCE,
    issuers: [{ issuer: ISSUER, jwksUri: JWKS_URI }],
    fetch: async () => Response.json({ keys: [publicJwk] }),
    onEvent: (event) => events.push(event),
    ...extra,
  });
  return { edge, events };
}

describe('docs/guard.md: Results and errors', () => {
  it('the example reads the principal as the comments say (Duende array scope, azp as clientId)', async () => {
    const { edge: guard } = pageGuard();
    const token = await accessToken({ scope: ['orders:write', 'orders:read'], client_id: undefined, azp: 'spa' });
    const headers: Record<string, string | string[] | undefined> = { authorization: `Bearer ${token}` };
    const result = await guard.authenticate({ method: 'GET', headers, url: '/orders' });
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    const principal: Principal = result.principal;
    expect(principal.sub).toBe('user-1');
    expect(principal.scope.has('orders:write')).toBe(true);
    expect(principal.clientId).toBe('spa');
  });

  it('the 401 and 400 challenges are the ones the page prints', async () => {
    const { edge } = pageGuard();
    const expired = await accessToken({ exp: nowSeconds() - 60 });
    const result = await edge.authenticate({
      method: 'GET',
      url: '/',
      headers: { authorization: `Bearer ${expired}` },
    });
    expect(result.ok || result.error.wwwAuthenticate).toBe(
      'Bearer realm="api", error="invalid_token", error_description="The access token expired"',
    );
    const two = await edge.authenticate({
      method: 'GET',
      headers: { authorization: ['Bearer a.b.c', 'Bearer d.e.f'] },
    });
    expect(two.ok || [two.error.status, two.error.wwwAuthenticate]).toEqual([
      400,
      'Bearer realm="api", error="invalid_request", error_description="The request presented more than one access token"',
    ]);
  });
});

describe('docs/guard.md: Authorization', () => {
  it('the policy example and the step-up challenge printed under it', async () => {
    const { edge } = pageGuard();
    const result = await edge.verify(await accessToken({ tenant: 't1', roles: ['clerk', 'eu'] }));
    if (!result.ok) throw result.error;
    const principal = result.principal;
    const rules = [
      requireScopes('orders:write'), // every listed scope
      requireRoles('clerk'), // every listed role
      requireAnyRole('eu', 'us'), // at least one
      policy((p, request) => request.url?.startsWith(`/tenants/${String(p.claims.tenant)}/`) === true),
    ];
    const decision = authorizeRequest(principal, rules, { headers: {}, url: '/tenants/t1/orders', method: 'POST' });
    expect(decision.ok).toBe(true);
    const other = authorizeRequest(principal, rules, { headers: {}, url: '/tenants/t2/orders', method: 'POST' });
    expect(other.ok || [other.error.status, other.error.code]).toEqual([403, 'insufficient_scope']);

    const stepUp = authorizeRequest(
      principal,
      [requireAuthentication({ acrValues: ['urn:example:mfa'], maxAge: 300 })],
      { headers: {} },
    );
    expect(stepUp.ok || [stepUp.error.status, stepUp.error.wwwAuthenticate]).toEqual([
      401,
      'Bearer realm="api", error="insufficient_user_authentication", error_description="A more recent or stronger user authentication is required", acr_values="urn:example:mfa", max_age="300"',
    ]);
  });
});

describe('docs/guard.md: Events and counters', () => {
  it('the counters the example reads move as the page says', async () => {
    const { edge: guard, events } = pageGuard();
    const token = await accessToken();
    await guard.verify(token);
    await guard.verify(token);
    await guard.verify(await accessToken({ exp: nowSeconds() - 60 }));
    const stats = guard.stats();
    expect(stats.rejected.token_expired).toBe(1);
    expect(stats.cacheHits).toBe(1);
    expect(stats.jwksFetches).toBe(1);
    expect(stats.jwksStaleUses).toBe(0);
    expect(events.map((event) => event.type)).toEqual(['jwks-fetch', 'authenticated', 'authenticated', 'rejected']);
  });
});

describe('docs/guard.md: At the gateway and Behind the gateway', () => {
  it('the internal token carries the claims the page lists, and the verifier example takes it', async () => {
    const { edge } = pageGuard();
    const verified = await edge.verify(await accessToken({ email: 'u@example.com', tenant: 't1', roles: ['clerk'] }));
    if (!verified.ok) throw verified.error;
    const principal = verified.principal;
    const incoming: Record<string, string | string[] | undefined> = {
      authorization: 'Bearer x',
      'x-tenant-id': 't9',
      'x-user-id': 'admin',
      accept: 'application/json',
    };
    // ---- the page's example ----
    const internalTokens = createInternalTokenIssuer({
      issuer: 'https://gateway.example',
      ttl: 60, // seconds; EdDSA key generated when `keys` is omitted
      claims: ['email', 'tenant'], // extra claims copied from the caller's token
    });
    const headers = await forwardHeaders2(incoming, principal, {
      issuer: internalTokens,
      audience: 'orders-service',
      extra: ['x-tenant-*'], // more families to strip
    });
    // ---- end ----
    expect(Object.keys(headers).sort()).toEqual(['accept', 'idem-internal-token']);
    const token = headers['idem-internal-token'] as string;
    const [header, payload] = token
      .split('.')
      .slice(0, 2)
      .map((part) => JSON.parse(Buffer.from(part, 'base64url').toString('utf8')) as Record<string, unknown>);
    expect(header).toMatchObject({ alg: 'EdDSA', typ: 'internal+jwt' });
    expect(Object.keys(payload ?? {}).sort()).toEqual(
      [
        'iss',
        'aud',
        'sub',
        'scope',
        'roles',
        'client_id',
        'jti',
        'orig_iss',
        'orig_aud',
        'iat',
        'exp',
        'email',
        'tenant',
      ].sort(),
    );
    expect((payload?.exp as number) - (payload?.iat as number)).toBe(60);

    const verifier = createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders-service',
      jwks: () => internalTokens.jwks(),
    });
    const behind = await verifier.authenticate({ method: 'GET', url: '/', headers: { 'idem-internal-token': token } });
    expect(behind.ok && [behind.principal.iss, [...behind.principal.aud]]).toEqual([ISSUER, [AUDIENCE]]);
    // An edge token is never accepted in place of the internal one, nor the reverse.
    expect(
      code(
        await verifier.authenticate({
          method: 'GET',
          url: '/',
          headers: { 'idem-internal-token': await accessToken() },
        }),
      ),
    ).not.toBe('ok');
    expect(code(await edge.verify(token))).not.toBe('ok');
  });
});

async function dpopProof(key: CryptoKey, jwk: JWK, token: string, claims: Record<string, unknown> = {}) {
  return new SignJWT({
    jti: crypto.randomUUID(),
    htm: 'POST',
    htu: 'https://api.example/orders',
    iat: nowSeconds(),
    ath: createHash('sha256').update(token).digest('base64url'),
    ...claims,
  })
    .setProtectedHeader({ typ: 'dpop+jwt', alg: 'ES256', jwk })
    .sign(key);
}

describe('docs/guard.md: DPoP', () => {
  it('the example runs as written on a real Redis: a proof passes once, its replay is refused', async () => {
    routeFetch({ 'https://id.example/jwks': jwksRoute() });
    const client = createRedisClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
    const redis = {
      // The page's `dpop:` prefix, under this audit's own.
      set: (key: string, value: string, options: { NX: true; PX: number }) =>
        client.set(`audit-docsguard:${key}`, value, options),
    };
    await client.connect();
    try {
      // ---- the page's example, as written (but for `redis`, above) ----
      const guard = createGuard({
        audience: 'https://api.example',
        issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }],
        dpop: {
          origin: 'https://api.example',
          // One replay memory for every gateway instance: SET NX with the proof's remaining life.
          replay: async (key, expiresAtMs) =>
            (await redis.set(`dpop:${key}`, '1', { NX: true, PX: Math.max(1, expiresAtMs - Date.now()) })) === 'OK',
        },
      });
      // ---- end ----
      const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
      const jwk = await exportJWK(publicKey);
      const token = await accessToken({ cnf: { jkt: await calculateJwkThumbprint(jwk) } });
      const proof = await dpopProof(privateKey, jwk, token);
      const request = { method: 'POST', url: '/orders', headers: { authorization: `DPoP ${token}`, dpop: proof } };
      expect(code(await guard.authenticate(request))).toBe('ok');
      const replayed = await guard.authenticate(request);
      expect(replayed.ok || [replayed.error.code, replayed.error.wwwAuthenticate]).toEqual([
        'dpop_proof_replayed',
        'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof was already used", algs="ES256 EdDSA Ed25519 PS256 RS256"',
      ]);
      // A bound token as a plain bearer: token_bound.
      expect(
        code(await guard.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${token}` } })),
      ).toBe('token_bound');
      // Both schemes accepted: a 401 offers both, as the page prints it.
      const none = await guard.authenticate({ method: 'GET', url: '/', headers: {} });
      expect(none.ok || none.error.wwwAuthenticate).toBe(
        'Bearer realm="api", DPoP realm="api", algs="ES256 EdDSA Ed25519 PS256 RS256"',
      );
    } finally {
      await client.quit();
    }
  });
});

describe('docs/guard.md: Optional authentication', () => {
  it('the example runs as written: anonymous served, bad credentials refused, anonymous writes 401', async () => {
    routeFetch({ [JWKS_URI]: jwksRoute() });
    // ---- the page's example, as written ----
    const edge = createGuard({
      audience: 'https://api.example',
      issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/.well-known/jwks.json' }],
    });
    const app = express();
    const anyone = guard(edge, { optional: true });
    app.get('/products', anyone, (req, res) => {
      res.json({ prices: req.auth === undefined ? 'list' : `for ${req.auth.sub}` });
    });
    // An anonymous request gets 401 from authorize(), with the guard's challenge.
    app.get('/orders', anyone, authorize(requireScopes('orders:read')), (_req, res) => {
      res.json([]);
    });
    // And from the idempotency middleware scoped by the default principal: an anonymous write has no
    // caller to scope its key to (not a 500 scope_missing).
    app.post('/carts', anyone, idempotency({ store: memoryStore() }), express.json(), (_req, res) => {
      res.status(201).json({ id: 'cart_1' });
    });
    // ---- end ----
    const server = await listen(app);
    try {
      const get = (path: string, headers: Record<string, string> = {}) => fetch(`${server.url}${path}`, { headers });
      expect(await (await get('/products')).json()).toEqual({ prices: 'list' });
      const token = await accessToken();
      expect(await (await get('/products', { authorization: `Bearer ${token}` })).json()).toEqual({
        prices: 'for user-1',
      });
      const basic = await get('/products', { authorization: 'Basic dXNlcjpwYXNz' });
      expect(basic.status).toBe(401);
      const anonymous = await get('/orders');
      expect([anonymous.status, anonymous.headers.get('www-authenticate')]).toEqual([401, 'Bearer realm="api"']);
      const write = await fetch(`${server.url}/carts`, { method: 'POST', headers: { 'idempotency-key': 'k1' } });
      expect(write.status).toBe(401);
    } finally {
      await server.close();
    }
  });
});

describe('docs/guard.md: Issuers', () => {
  it('the multi-issuer example: a PEM without kid verifies a token naming kid partner-2026', async () => {
    const partner = await generateKeyPair('ES256', { extractable: true });
    const dir = mkdtempSync(join(tmpdir(), 'audit-docsguard-'));
    writeFileSync(join(dir, 'partner.pem'), await exportSPKI(partner.publicKey));
    const previous = process.env.LEGACY_HS256_SECRET;
    process.env.LEGACY_HS256_SECRET = 'legacy-hs256-secret-of-32-bytes+';
    const cwd = process.cwd();
    process.chdir(dir);
    try {
      routeFetch({ [JWKS_URI]: jwksRoute() });
      // ---- the page's example, as written ----
      const guard = createGuard({
        audience: ['https://api.example', 'https://api.example/v2'],
        maxTokenAge: 3600,
        issuers: [
          { issuer: 'https://id.example', jwksUri: 'https://id.example/.well-known/jwks.json', algorithms: ['RS256'] },
          {
            issuer: 'https://partner.example',
            publicKeys: [readFileSync('partner.pem', 'utf8')],
            algorithms: ['ES256'],
          },
          { issuer: 'https://legacy.internal', secret: process.env.LEGACY_HS256_SECRET ?? '', typ: ['at+jwt', 'jwt'] },
        ],
      });
      // ---- end ----
      const partnerToken = await new SignJWT({ sub: 'p-1', aud: 'https://api.example/v2', iat: nowSeconds() })
        .setProtectedHeader({ alg: 'ES256', kid: 'partner-2026', typ: 'at+jwt' })
        .setIssuer('https://partner.example')
        .setExpirationTime(nowSeconds() + 300)
        .sign(partner.privateKey);
      expect(code(await guard.verify(partnerToken))).toBe('ok');
      const legacy = await new SignJWT({ sub: 'l-1', aud: 'https://api.example', iat: nowSeconds() })
        .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
        .setIssuer('https://legacy.internal')
        .setExpirationTime(nowSeconds() + 300)
        .sign(new TextEncoder().encode('legacy-hs256-secret-of-32-bytes+'));
      expect(code(await guard.verify(legacy))).toBe('ok');
      // maxTokenAge: iat becomes required.
      expect(code(await guard.verify(await accessToken({ iat: undefined })))).toBe('claim_invalid');
      // A key of issuer A never verifies a token that claims iss B.
      const crossed = await new SignJWT({ sub: 'p-1', aud: AUDIENCE, iat: nowSeconds() })
        .setProtectedHeader({ alg: 'ES256', kid: 'partner-2026', typ: 'at+jwt' })
        .setIssuer(ISSUER)
        .setExpirationTime(nowSeconds() + 300)
        .sign(partner.privateKey);
      expect(code(await guard.verify(crossed))).not.toBe('ok');
    } finally {
      process.chdir(cwd);
      if (previous === undefined) delete process.env.LEGACY_HS256_SECRET;
      else process.env.LEGACY_HS256_SECRET = previous;
    }
  });
});

describe('docs/guard.md: Fastify and Koa', () => {
  it('the example runs as written on Fastify and on Koa', async () => {
    routeFetch({ 'https://id.example/jwks': jwksRoute() });
    // ---- the page's example, as written ----
    const edge = createGuard({
      audience: 'https://api.example',
      issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }],
    });

    const fastify = Fastify();
    await fastify.register(authPlugin); // decorates request.auth
    fastify.post(
      '/orders',
      { onRequest: [fastifyGuard(edge), fastifyAuthorize(requireScopes('orders:write'))] },
      async (request) => ({
        by: request.auth?.sub,
      }),
    );

    const koa = new Koa();
    koa.use(koaGuard(edge)); // ctx.state.auth
    // ---- end ----
    koa.use((ctx) => {
      ctx.body = { by: (ctx.state.auth as Principal | undefined)?.sub };
    });
    const token = await accessToken();
    const ok = await fastify.inject({ method: 'POST', url: '/orders', headers: { authorization: `Bearer ${token}` } });
    expect([ok.statusCode, ok.json()]).toEqual([200, { by: 'user-1' }]);
    const reader = await fastify.inject({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `Bearer ${await accessToken({ scope: 'orders:read' })}` },
    });
    expect([reader.statusCode, reader.headers['cache-control']]).toEqual([403, 'no-store']);
    await fastify.close();

    const server = koa.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
      const koaOk = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
      expect([koaOk.status, await koaOk.json()]).toEqual([200, { by: 'user-1' }]);
      const koaMissing = await fetch(url);
      expect([
        koaMissing.status,
        koaMissing.headers.get('www-authenticate'),
        koaMissing.headers.get('cache-control'),
      ]).toEqual([401, 'Bearer realm="api"', 'no-store']);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

describe('docs/guard.md: a jwks function', () => {
  // Was wrong: a `jwks` function that threw when read at construction let its own error out of
  // createGuard and createInternalVerifier (here a plain Error "boom", naming no option), where every
  // other bad option is a TypeError that names it, and a set that does not import already was one.
  it('that throws at construction is a TypeError naming the issuer, with the error as its cause', () => {
    const boom = new Error('boom');
    const read = () => {
      throw boom;
    };
    for (const build of [
      () => createInternalVerifier({ issuer: 'https://gateway.example', audience: 'orders-service', jwks: read }),
      () => createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, jwks: read }] }),
    ]) {
      let thrown: unknown;
      try {
        build();
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(TypeError);
      expect((thrown as TypeError).message).toMatch(/^issuer https:\/\/\S+: the jwks function threw/);
      expect((thrown as TypeError).cause).toBe(boom);
    }
  });

  it('a jwks function that throws after construction is keys_unavailable, and the same token passes once it reads again', async () => {
    const gateway = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    let failing = false;
    const verifier = createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders-service',
      cache: false,
      jwks: () => {
        if (failing) throw new Error('file not there yet');
        return gateway.jwks();
      },
    });
    const { edge } = pageGuard();
    const verified = await edge.verify(await accessToken());
    if (!verified.ok) throw verified.error;
    const token = await gateway.mint(verified.principal, { audience: 'orders-service' });
    failing = true;
    const refused = await verifier.verify(token);
    expect(refused.ok || [refused.error.code, refused.error.retryable]).toEqual(['keys_unavailable', true]);
    failing = false;
    expect(code(await verifier.verify(token))).toBe('ok');
  });
});

describe('docs/guard.md: DPoP proof times', () => {
  it("a proof's iat is held to the guard's clockTolerance, not to an issuer's own", async () => {
    const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
    const jwk = await exportJWK(publicKey);
    const build = (guardTolerance: number) =>
      createGuard({
        audience: AUDIENCE,
        clockTolerance: guardTolerance,
        issuers: [{ issuer: ISSUER, jwksUri: JWKS_URI, clockTolerance: 60 }],
        fetch: async () => Response.json({ keys: [publicJwk] }),
        dpop: { origin: 'https://api.example' },
      });
    const attempt = async (guardTolerance: number) => {
      const token = await accessToken({ cnf: { jkt: await calculateJwkThumbprint(jwk) } });
      const proof = await dpopProof(privateKey, jwk, token, { iat: nowSeconds() + 30 });
      const request = { method: 'POST', url: '/orders', headers: { authorization: `DPoP ${token}`, dpop: proof } };
      return code(await build(guardTolerance).authenticate(request));
    };
    expect(await attempt(5)).toBe('dpop_proof_invalid');
    expect(await attempt(60)).toBe('ok');
  });
});

describe('docs/guard.md: dpop.required and verify()', () => {
  // Was wrong: with `dpop: { required: true }` ("Refuse Bearer credentials"), `guard.verify(token)`
  // accepted a plain, unbound access token: the one kind of token the option exists to refuse (a bound
  // one was token_bound there, since verify() takes no proof). A gateway that authenticated a
  // WebSocket or a queue message with verify() got bearer semantics without a word. Decided: verify()
  // refuses every token then (dpop_proof_invalid: the proof it cannot have).
  it('verify() of any token is refused when DPoP is required (dpop_proof_invalid)', async () => {
    const { edge } = pageGuard({ dpop: { required: true, origin: 'https://api.example' } });
    const token = await accessToken();
    expect(
      code(await edge.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${token}` } })),
    ).toBe('token_missing');
    expect(code(await edge.verify(token))).toBe('dpop_proof_invalid');
  });
});
