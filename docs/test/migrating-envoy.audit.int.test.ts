// Audit of docs/migrating.md, "From Envoy's JWT filter (`jwt_authn`)": every claim the section makes
// about the guard, on a real Express server behind the guard, with the issuer's keys served as a
// JWKS over http on 127.0.0.1 and the guard's clock injected (no test waits for a cooldown or a
// lifetime). What the page says Envoy does is cited to research/jwt-guard-anchors.md, not run:
// Envoy is not installable here. Each row of the section's "Behaviour differences that matter"
// table is named by the test that observes it, and the last test checks none is left unobserved.
import http from 'node:http';
import { authorize, guard as expressGuard } from '@idem/express';
import { createGuard, createInternalTokenIssuer, forwardHeaders, type GuardOptions, requireScopes } from '@idem/guard';
import express from 'express';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';
import { migratingSection } from './migrating-section.js';

const heading = "From Envoy's JWT filter (`jwt_authn`)";
const { section, differenceRows, differenceRow, optionRow, observed } = migratingSection(heading);

const T0 = Date.UTC(2026, 11, 1, 12, 0, 0);
let clock = T0;
const seconds = () => Math.floor(clock / 1000);
const ISS = 'https://id.example/';
const AUD = 'https://api.example';

const first = await generateKeyPair('RS256', { extractable: true });
const rotated = await generateKeyPair('RS256', { extractable: true });
const published = [{ ...(await exportJWK(first.publicKey)), kid: 'key-1', alg: 'RS256', use: 'sig' }];
const rotatedJwk = { ...(await exportJWK(rotated.publicKey)), kid: 'key-2', alg: 'RS256', use: 'sig' };

// The issuer's JWKS: one path per guard, a fetch counter per path, and an outage switch.
const fetches = new Map<string, number>();
let jwksDown = false;
const jwksServer = http.createServer((req, res) => {
  fetches.set(req.url ?? '', (fetches.get(req.url ?? '') ?? 0) + 1);
  if (jwksDown) {
    res.statusCode = 503;
    res.end();
    return;
  }
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ keys: published }));
});
let jwksBase = '';
const fetched = (name: string) => fetches.get(`/${name}`) ?? 0;

type Claims = Record<string, unknown>;
/** An access token at the current clock; a claim given as `null` is left out. */
async function mint(options: { header?: Claims; claims?: Claims; key?: CryptoKey } = {}): Promise<string> {
  const header: Claims = { alg: 'RS256', kid: 'key-1', typ: 'at+jwt', ...options.header };
  const claims: Claims = {
    iss: ISS,
    aud: AUD,
    sub: 'user-1',
    iat: seconds(),
    exp: seconds() + 600,
    scope: 'orders:read',
    ...options.claims,
  };
  for (const bag of [header, claims]) for (const name of Object.keys(bag)) if (bag[name] === null) delete bag[name];
  return new SignJWT(claims).setProtectedHeader(header as { alg: string }).sign(options.key ?? first.privateKey);
}

const closers: Array<() => Promise<void>> = [];

/** The guard with `options` over the issuer (its JWKS at /`name`), in front of GET and POST /orders. */
async function server(
  name: string,
  options: Partial<GuardOptions> = {},
  issuer: Record<string, unknown> = {},
  glue: { optional?: boolean } = {},
): Promise<string> {
  const edge = createGuard({
    audience: AUD,
    now: () => clock,
    ...options,
    issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/${name}`, ...issuer }],
  } as GuardOptions);
  const app = express();
  app.get('/orders', expressGuard(edge, glue), (req, res) => {
    res.json({ sub: req.auth?.sub ?? null });
  });
  app.post('/orders', expressGuard(edge, glue), authorize(requireScopes('orders:write')), (req, res) => {
    res.status(201).json({ sub: req.auth?.sub });
  });
  const { url, close } = await listen(http.createServer(app));
  closers.push(close);
  return url;
}

interface Answer {
  status: number;
  challenge: string | null;
  type: string | null;
  body: { code?: string; sub?: string | null };
}
async function ask(url: string, headers: Record<string, string> = {}, init: RequestInit = {}): Promise<Answer> {
  const answer = await fetch(url, { headers, ...init });
  const text = await answer.text();
  return {
    status: answer.status,
    challenge: answer.headers.get('www-authenticate'),
    type: answer.headers.get('content-type'),
    body: text === '' ? {} : JSON.parse(text),
  };
}
const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

beforeAll(async () => {
  const jwks = await listen(jwksServer);
  jwksBase = jwks.url;
  closers.push(jwks.close);
});
afterAll(async () => {
  for (const close of closers) await close();
});

describe("docs/migrating.md, From Envoy's JWT filter: behaviour differences", () => {
  it('a refused request is a 401 problem+json with the RFC 6750 challenge; without a token, no error', async () => {
    clock = T0;
    const url = `${await server('refused')}/orders`;
    const expired = await ask(url, bearer(await mint({ claims: { exp: seconds() - 120 } })));
    expect(expired).toMatchObject({
      status: 401,
      type: 'application/problem+json',
      challenge: 'Bearer realm="api", error="invalid_token", error_description="The access token expired"',
      body: { code: 'token_expired' },
    });
    expect(await ask(url)).toMatchObject({ status: 401, challenge: 'Bearer realm="api"' });
    expect(differenceRow('A refused request')).toMatch(/problem\+json[^|]*realm="api"/);
  });

  it('another audience is 401 audience_invalid with the invalid_token challenge (Envoy: 403)', async () => {
    clock = T0;
    const url = `${await server('audience')}/orders`;
    const answer = await ask(url, bearer(await mint({ claims: { aud: 'https://other.example' } })));
    expect(answer).toMatchObject({ status: 401, body: { code: 'audience_invalid' } });
    expect(answer.challenge).toMatch(/error="invalid_token"/);
    expect(differenceRow('Another audience')).toMatch(/401 `audience_invalid`/);
  });

  it('expired 30 s ago: refused with the default tolerance of 5 s, accepted with clockTolerance: 60; 61 throws', async () => {
    clock = T0;
    const token = await mint({ claims: { iat: seconds() - 630, exp: seconds() - 30 } });
    const strict = await ask(`${await server('tolerance-5')}/orders`, bearer(token));
    expect(strict).toMatchObject({ status: 401, body: { code: 'token_expired' } });
    const lenient = await ask(`${await server('tolerance-60', { clockTolerance: 60 })}/orders`, bearer(token));
    expect(lenient.status).toBe(200);
    const within5 = await mint({ claims: { exp: seconds() - 4 } });
    expect((await ask(`${await server('tolerance-5b')}/orders`, bearer(within5))).status).toBe(200);
    expect(() =>
      createGuard({ audience: AUD, clockTolerance: 61, issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/x` }] }),
    ).toThrow(TypeError);
    expect(differenceRow('Expired by less than 60 s')).toMatch(/`clockTolerance: 60`/);
    expect(optionRow('`clock_skew_seconds` (60)')).toMatch(/`clockTolerance` \(5, at most 60\)/);
  });

  it('a token without exp is 401 claim_invalid, whatever the options', async () => {
    clock = T0;
    const answer = await ask(`${await server('no-exp')}/orders`, bearer(await mint({ claims: { exp: null } })));
    expect(answer).toMatchObject({ status: 401, body: { code: 'claim_invalid' } });
    expect(differenceRow('No `exp`')).toMatch(/401 `claim_invalid`/);
    expect(optionRow('`require_expiration`')).toMatch(/always on/);
  });

  it('an iat in the future is 401 token_issued_in_future', async () => {
    clock = T0;
    const token = await mint({ claims: { iat: seconds() + 600, exp: seconds() + 1200 } });
    const answer = await ask(`${await server('iat')}/orders`, bearer(token));
    expect(answer).toMatchObject({ status: 401, body: { code: 'token_issued_in_future' } });
    expect(differenceRow('`iat` in the future')).toMatch(/token_issued_in_future/);
  });

  it('typ: JWT is 401 type_invalid by default, accepted with the issuer typ of the After block', async () => {
    clock = T0;
    const token = await mint({ header: { typ: 'JWT' } });
    const strict = await ask(`${await server('typ')}/orders`, bearer(token));
    expect(strict).toMatchObject({ status: 401, body: { code: 'type_invalid' } });
    const relaxed = await ask(`${await server('typ-relaxed', {}, { typ: ['at+jwt', 'jwt'] })}/orders`, bearer(token));
    expect(relaxed.status).toBe(200);
    expect(differenceRow('`typ`')).toMatch(/typ: \['at\+jwt', 'jwt'\]/);
    expect(section()).toMatch(/typ: \['at\+jwt', 'jwt'\], \/\/ jwt_authn reads no typ/);
  });

  it('a key the provider publishes after the first fetch passes once the 30 s cooldown has run, not after 600 s', async () => {
    clock = T0;
    const url = `${await server('rotation')}/orders`;
    expect((await ask(url, bearer(await mint()))).status).toBe(200);
    expect(fetched('rotation')).toBe(1);
    try {
      published.push(rotatedJwk);
      clock = T0 + 1_000;
      const early = await ask(url, bearer(await mint({ header: { kid: 'key-2' }, key: rotated.privateKey })));
      expect(early).toMatchObject({ status: 401, body: { code: 'key_unknown' } });
      expect(fetched('rotation')).toBe(1); // within the cooldown of the first fetch
      clock = T0 + 31_000; // far within the set's 600 s lifetime
      const later = await ask(url, bearer(await mint({ header: { kid: 'key-2' }, key: rotated.privateKey })));
      expect(later.status).toBe(200);
      expect(fetched('rotation')).toBe(2);
    } finally {
      published.pop();
    }
    expect(differenceRow('Unknown `kid` (the identity provider rotated its key)')).toMatch(
      /one refetch per `cooldown` \(30 s\)/,
    );
  });

  it('the JWKS endpoint down: the last keys work staleIfError (1 h) past expiry, then 401 keys_unavailable', async () => {
    clock = T0;
    const url = `${await server('outage', { cache: false })}/orders`;
    expect((await ask(url, bearer(await mint()))).status).toBe(200);
    try {
      jwksDown = true;
      clock = T0 + 601_000; // the set (600 s) has expired; its refresh fails
      expect((await ask(url, bearer(await mint()))).status).toBe(200);
      expect(fetched('outage')).toBe(2);
      clock = T0 + (600 + 3600 + 31) * 1000;
      const closed = await ask(url, bearer(await mint()));
      expect(closed).toMatchObject({ status: 401, body: { code: 'keys_unavailable' } });
    } finally {
      jwksDown = false;
    }
    expect(differenceRow('JWKS endpoint down')).toMatch(/`staleIfError` \(1 h\)[^|]*keys_unavailable/);
  });

  it('?access_token= is ignored (401 token_missing) unless allowQueryToken', async () => {
    clock = T0;
    const token = await mint();
    const ignored = await ask(`${await server('query')}/orders?access_token=${token}`);
    expect(ignored).toMatchObject({ status: 401, body: { code: 'token_missing' } });
    const read = await ask(`${await server('query-on', { allowQueryToken: true })}/orders?access_token=${token}`);
    expect(read.status).toBe(200);
    expect(differenceRow('Token in the query string')).toMatch(/unless `allowQueryToken`/);
  });

  it('the Bearer scheme is read in any case, at the start of the value', async () => {
    clock = T0;
    const url = `${await server('scheme')}/orders`;
    const token = await mint();
    expect((await ask(url, { authorization: `bearer ${token}` })).status).toBe(200);
    expect((await ask(url, { authorization: `BEARER ${token}` })).status).toBe(200);
    expect(await ask(url, { authorization: `Token Bearer ${token}` })).toMatchObject({
      status: 401,
      body: { code: 'token_missing' },
    });
    expect(differenceRow('`Authorization` scheme')).toMatch(/`bearer <jwt>` is read/);
  });

  it('a missing scope is 403 insufficient_scope naming the scope in the challenge', async () => {
    clock = T0;
    const url = `${await server('scope')}/orders`;
    const refused = await ask(url, bearer(await mint()), { method: 'POST' });
    expect(refused).toMatchObject({ status: 403, body: { code: 'insufficient_scope' } });
    expect(refused.challenge).toMatch(/error="insufficient_scope"/);
    expect(refused.challenge).toMatch(/scope="orders:write"/);
    const allowed = await ask(url, bearer(await mint({ claims: { scope: 'orders:write' } })), { method: 'POST' });
    expect(allowed.status).toBe(201);
    expect(differenceRow('Scopes')).toMatch(/403 `insufficient_scope` with `scope="orders:write"`/);
  });

  it('optional: no credentials pass without req.auth; a bad token or another scheme is 401', async () => {
    clock = T0;
    const url = `${await server('optional', {}, {}, { optional: true })}/orders`;
    expect(await ask(url)).toMatchObject({ status: 200, body: { sub: null } });
    expect((await ask(url, bearer(await mint({ claims: { exp: seconds() - 120 } })))).status).toBe(401);
    expect((await ask(url, { authorization: 'Basic dXNlcjpwYXNz' })).status).toBe(401);
    expect((await ask(url, bearer(await mint()))).body).toEqual({ sub: 'user-1' });
    expect(differenceRow('`allow_missing`')).toMatch(/`\{ optional: true \}` does the same/);
    expect(optionRow('`allow_missing` ')).toMatch(/optional: true/);
  });

  it('client-sent identity headers: req.auth ignores them; forwardHeaders strips the families and the bearer', async () => {
    clock = T0;
    const url = `${await server('spoof')}/orders`;
    const token = await mint();
    const answer = await ask(url, { ...bearer(token), 'x-user-id': 'admin', 'x-jwt-payload': 'e30' });
    expect(answer.body).toEqual({ sub: 'user-1' });

    const internalTokens = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: () => clock });
    const edge = createGuard({
      audience: AUD,
      now: () => clock,
      issuers: [{ issuer: ISS, jwks: { keys: published } }],
    });
    const verified = await edge.verify(token);
    if (!verified.ok) throw new Error('the token should verify');
    const headers = await forwardHeaders(
      {
        ...bearer(token),
        'x-user-id': 'admin',
        x_user_id: 'admin',
        'x-auth-request-email': 'a@b',
        accept: 'text/plain',
      },
      verified.principal,
      { issuer: internalTokens, audience: 'orders-service' },
    );
    expect(Object.keys(headers).sort()).toEqual(['accept', 'idem-internal-token']);
    expect(differenceRow('Identity headers sent by the client')).toMatch(/strips whole families/);
    expect(optionRow('`forward` ')).toMatch(/drops `Authorization` unless `keepAuthorization: true`/);
  });

  it('every behaviour difference of the section is observed above', () => {
    expect(new Set(differenceRows())).toEqual(observed);
  });
});

describe("docs/migrating.md, From Envoy's JWT filter: the options table", () => {
  it('audiences: the guard requires an audience (createGuard throws without one); any of a list matches', async () => {
    expect(() => createGuard({ issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/y` }] } as GuardOptions)).toThrow(
      TypeError,
    );
    clock = T0;
    const url = `${await server('audiences', { audience: ['https://other.example', AUD] })}/orders`;
    expect((await ask(url, bearer(await mint()))).status).toBe(200);
    expect(optionRow('`audiences`')).toMatch(/without it, `createGuard` throws/);
  });

  it('async_fetch: refreshKeys() fetches the set before the first request, which then fetches nothing', async () => {
    clock = T0;
    const edge = createGuard({
      audience: AUD,
      now: () => clock,
      issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/warm` }],
    });
    expect(await edge.refreshKeys()).toEqual([{ issuer: ISS, outcome: 'fetched' }]);
    expect(fetched('warm')).toBe(1);
    expect((await edge.verify(await mint())).ok).toBe(true);
    expect(fetched('warm')).toBe(1);
    expect(optionRow('`remote_jwks.async_fetch`')).toMatch(/`guard\.refreshKeys\(\)` at startup/);
    expect(section()).toMatch(/await edge\.refreshKeys\(\); \/\/ async_fetch/);
  });

  it('cache_duration: 600 s without Cache-Control, then one refetch', async () => {
    clock = T0;
    const edge = createGuard({
      audience: AUD,
      now: () => clock,
      cache: false,
      issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/ttl` }],
    });
    expect((await edge.verify(await mint())).ok).toBe(true);
    clock = T0 + 500_000; // before the last tenth of the lifetime: no background refresh yet
    expect((await edge.verify(await mint())).ok).toBe(true);
    expect(fetched('ttl')).toBe(1);
    clock = T0 + 601_000;
    expect((await edge.verify(await mint())).ok).toBe(true);
    expect(fetched('ttl')).toBe(2);
    expect(optionRow('`remote_jwks.cache_duration` (600 s)')).toMatch(/`jwksOptions\.defaultTtl` \(600 s\)/);
  });

  it('max_lifetime: maxLifetime refuses a longer token, 401 lifetime_too_long', async () => {
    clock = T0;
    const url = `${await server('lifetime', { maxLifetime: 3600 })}/orders`;
    const long = await mint({ claims: { exp: seconds() + 7200 } });
    expect(await ask(url, bearer(long))).toMatchObject({ status: 401, body: { code: 'lifetime_too_long' } });
    expect((await ask(url, bearer(await mint()))).status).toBe(200);
    expect(optionRow('`max_lifetime`')).toMatch(/`maxLifetime`/);
  });

  it('requires_all: two Authorization headers are 400 multiple_tokens', async () => {
    clock = T0;
    const url = new URL(`${await server('two-tokens')}/orders`);
    const token = await mint();
    const status = await new Promise<number>((resolve, reject) => {
      const request = http.request(
        { host: url.hostname, port: url.port, path: url.pathname, method: 'GET' },
        (response) => {
          response.resume();
          resolve(response.statusCode ?? 0);
        },
      );
      request.on('error', reject);
      request.setHeader('authorization', [`Bearer ${token}`, `Bearer ${token}`]);
      request.end();
    });
    expect(status).toBe(400);
    expect(optionRow('`requires_all`')).toMatch(/400 `multiple_tokens`/);
  });

  it('bypass_cors_preflight: the guard answers a preflight 401, so CORS goes before it', async () => {
    clock = T0;
    // Mounted app-wide, as the filter ran on every request: a guard on routes only never sees an
    // OPTIONS, which Express answers itself.
    const app = express();
    app.use(
      expressGuard({ audience: AUD, now: () => clock, issuers: [{ issuer: ISS, jwksUri: `${jwksBase}/preflight` }] }),
    );
    app.post('/orders', (_req, res) => {
      res.status(201).end();
    });
    const { url: base, close } = await listen(http.createServer(app));
    closers.push(close);
    const answer = await ask(
      `${base}/orders`,
      {
        origin: 'https://app.example',
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization',
      },
      { method: 'OPTIONS' },
    );
    expect(answer.status).toBe(401);
    expect(optionRow('`bypass_cors_preflight`')).toMatch(/before the guard/);
  });

  it('requires_any: one guard with two issuers takes a token of either, each with its own keys', async () => {
    clock = T0;
    const other = await generateKeyPair('ES256', { extractable: true });
    const edge = createGuard({
      audience: AUD,
      now: () => clock,
      issuers: [
        { issuer: ISS, jwks: { keys: published } },
        {
          issuer: 'https://partner.example',
          jwks: { keys: [{ ...(await exportJWK(other.publicKey)), kid: 'p-1', alg: 'ES256' }] },
        },
      ],
    });
    expect((await edge.verify(await mint())).ok).toBe(true);
    const partner = await mint({
      header: { alg: 'ES256', kid: 'p-1' },
      claims: { iss: 'https://partner.example' },
      key: other.privateKey,
    });
    expect((await edge.verify(partner)).ok).toBe(true);
    // The partner's key never verifies a token that names the first issuer.
    const crossed = await mint({ header: { alg: 'ES256', kid: 'p-1' }, key: other.privateKey });
    expect((await edge.verify(crossed)).ok).toBe(false);
    expect(optionRow('`requires_any`')).toMatch(/several `issuers`/);
  });
});
