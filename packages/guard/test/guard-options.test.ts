import { describe, expect, it, vi } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  type GuardResult,
  guardRequestFromNode,
  isGuard,
  optionalGuard,
  requireAuthentication,
  requireScopes,
} from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET, testKeys } from './support/tokens.js';

const keys = testKeys();
const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('key sources and options', () => {
  it('verifies RS256, PS256, ES256 and EdDSA from PEM, JWK, { pem, kid, alg } and a local JWKS', async () => {
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [
        {
          issuer: ISSUER,
          algorithms: ['RS256', 'PS256', 'ES256', 'EdDSA'],
          publicKeys: [
            { pem: keys.rsa.publicPem, kid: 'rs', alg: 'RS256' },
            { ...keys.rsa2.publicJwk, kid: 'ps', alg: 'PS256' },
            keys.ed.publicPem,
          ],
          jwks: { keys: [{ ...keys.ec.publicJwk, kid: 'ec' }] },
        },
      ],
    });
    await guard.ready();
    expect(code(await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid: 'rs' } })))).toBe(
      'ok',
    );
    expect(
      code(await guard.verify(makeToken({ alg: 'PS256', key: keys.rsa2.privateKey, header: { kid: 'ps' } }))),
    ).toBe('ok');
    expect(code(await guard.verify(makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'ec' } })))).toBe(
      'ok',
    );
    expect(code(await guard.verify(makeToken({ alg: 'EdDSA', key: keys.ed.privateKey })))).toBe('ok');
    // The PEM RSA key is pinned to RS256: a PS256 token under its kid is refused.
    expect(code(await guard.verify(makeToken({ alg: 'PS256', key: keys.rsa.privateKey, header: { kid: 'rs' } })))).toBe(
      'algorithm_not_allowed',
    );
  });

  it('a configured key without a kid verifies tokens whatever kid they name; a key with a kid only its own', async () => {
    const clock = manualClock();
    const rs256 = (key: typeof keys.rsa, kid: string) =>
      makeToken({ alg: 'RS256', key: key.privateKey, header: { kid } });
    // The documented partner.pem setup: a PEM has no kid, the identity provider names one anyway.
    const pem = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [{ issuer: ISSUER, publicKeys: [keys.ec.publicPem], algorithms: ['ES256'] }],
    });
    expect(
      code(await pem.verify(makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'partner-2026' } }))),
    ).toBe('ok');
    const secret = createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    expect(code(await secret.verify(makeToken({ header: { kid: 'hs-1' } })))).toBe('ok');

    // A key-less key listed first, a named one second.
    const mixed = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [
        {
          issuer: ISSUER,
          algorithms: ['RS256'],
          publicKeys: [keys.rsa2.publicPem, { pem: keys.rsa.publicPem, kid: 'named' }],
        },
      ],
    });
    const subtle = globalThis.crypto.subtle;
    const verifySpy = vi.spyOn(subtle, 'verify');
    try {
      // The key carrying the token's kid is tried first, whatever the configured order.
      expect(code(await mixed.verify(rs256(keys.rsa, 'named')))).toBe('ok');
      expect(verifySpy).toHaveBeenCalledTimes(1);
    } finally {
      verifySpy.mockRestore();
    }
    expect(code(await mixed.verify(rs256(keys.rsa2, 'anything')))).toBe('ok');
    // A named key is never tried for another kid: only the key-less one is, and it did not sign this.
    expect(code(await mixed.verify(rs256(keys.rsa, 'other')))).toBe('signature_invalid');
    // Without a key-less key, an unknown kid is still unknown.
    const named = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [{ issuer: ISSUER, algorithms: ['RS256'], publicKeys: [{ pem: keys.rsa.publicPem, kid: 'named' }] }],
    });
    expect(code(await named.verify(rs256(keys.rsa, 'other')))).toBe('key_unknown');
  });

  it('refuses duplicate kids, private material and mixed secrets at construction', () => {
    const base = { audience: AUDIENCE };
    const withKeys = (publicKeys: object[]) => () =>
      createGuard({ ...base, issuers: [{ issuer: ISSUER, publicKeys: publicKeys as never }] });
    expect(
      withKeys([
        { ...keys.rsa.publicJwk, kid: 'a', alg: 'RS256' },
        { ...keys.rsa2.publicJwk, kid: 'a', alg: 'RS256' },
      ]),
    ).toThrow(/duplicate kid/);
    // One kid for two algorithms (RFC 7517 4.5 lets keys of different types share one): a token's
    // `alg` picks the one key, so nothing competes.
    expect(
      withKeys([
        { ...keys.ec.publicJwk, kid: 'a' },
        { ...keys.ed.publicJwk, kid: 'a' },
      ]),
    ).not.toThrow();
    expect(() =>
      createGuard({ ...base, issuers: [{ issuer: ISSUER, publicKeys: [{ ...keys.ec.publicJwk, d: 'AAAA' }] }] }),
    ).toThrow(TypeError);
    expect(() =>
      createGuard({ ...base, issuers: [{ issuer: ISSUER, secret: SECRET, publicKeys: [keys.ec.publicPem] }] }),
    ).toThrow(TypeError);
    expect(() =>
      createGuard({
        ...base,
        issuers: [
          { issuer: ISSUER, secret: SECRET },
          { issuer: ISSUER, secret: SECRET },
        ],
      }),
    ).toThrow(/twice/);
    expect(() => createGuard({ ...base, issuers: [{ issuer: ISSUER, publicKeys: ['not a pem'] }] })).toThrow(TypeError);
    // A secret is pinned to one algorithm: with two listed, tokens of the second were key_unknown for
    // good and nothing said so.
    const long = 'x'.repeat(16) + SECRET + SECRET;
    expect(() =>
      createGuard({ ...base, issuers: [{ issuer: ISSUER, secret: long, algorithms: ['HS256', 'HS512'] }] }),
    ).toThrow(/a secret verifies one algorithm; list one \(got HS256, HS512\)/);
    expect(() =>
      createGuard({ ...base, issuers: [{ issuer: ISSUER, secret: long, algorithms: ['HS512'] }] }),
    ).not.toThrow();
  });

  it('announces RFC 9728 resource metadata and a custom realm in 401 challenges', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      realm: 'orders',
      resourceMetadata: 'https://api.example/.well-known/oauth-protected-resource',
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const result = await guard.authenticate({ headers: {} });
    expect(!result.ok && result.error.wwwAuthenticate).toBe(
      'Bearer realm="orders", resource_metadata="https://api.example/.well-known/oauth-protected-resource"',
    );
    expect(guard.realm).toBe('orders');
    expect(isGuard(guard)).toBe(true);
    expect(isGuard({ audience: AUDIENCE })).toBe(false);
  });

  it('guard.authorize challenges carry resource_metadata and the DPoP offer, like every other challenge', async () => {
    const metadata = 'https://api.example/.well-known/oauth-protected-resource';
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      resourceMetadata: metadata,
      dpop: { origin: 'https://api.example', algorithms: ['ES256'] },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const verified = await guard.verify(makeToken({ claims: { acr: 'urn:example:pwd' } }));
    if (!verified.ok) throw new Error(verified.error.code);
    const stepUp = guard.authorize(verified.principal, [requireAuthentication({ acrValues: ['urn:example:mfa'] })]);
    expect(!stepUp.ok && stepUp.error.wwwAuthenticate).toBe(
      `Bearer realm="api", error="insufficient_user_authentication", error_description="A more recent or stronger user authentication is required", acr_values="urn:example:mfa", resource_metadata="${metadata}", DPoP realm="api", algs="ES256"`,
    );
    const scope = guard.authorize(verified.principal, [requireScopes('orders:write')]);
    expect(!scope.ok && scope.error.wwwAuthenticate).toBe(
      `Bearer realm="api", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:write", resource_metadata="${metadata}"`,
    );
    expect(!scope.ok && scope.error.wwwAuthenticate).toBe(
      guard.error('insufficient_scope').wwwAuthenticate.replace('needs"', 'needs", scope="orders:write"'),
    );
    // With DPoP required, every challenge of the guard is a DPoP one, its refusals included.
    const dpopOnly = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      dpop: { origin: 'https://api.example', algorithms: ['ES256'], required: true },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const refused = dpopOnly.authorize(verified.principal, [requireScopes('orders:write')]);
    expect(!refused.ok && refused.error.wwwAuthenticate).toBe(
      'DPoP realm="api", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:write", algs="ES256"',
    );
  });

  it('limits are checked at construction: positive integers, undefined meaning the default', async () => {
    const build = (limits: unknown) =>
      createGuard({
        audience: AUDIENCE,
        now: manualClock().now,
        limits: limits as never,
        issuers: [{ issuer: ISSUER, secret: SECRET }],
      });
    for (const limits of [
      { maxTokenLength: 0 },
      { maxTokenLength: -1 },
      { maxHeaderLength: 1.5 },
      { maxDepth: Number.POSITIVE_INFINITY },
      { maxDepth: Number.NaN },
      { maxDepth: '16' },
      { maxDepth: 100_000 },
      null,
      'big',
    ]) {
      expect(() => build(limits), JSON.stringify(limits)).toThrow(TypeError);
    }
    // An explicit undefined keeps the default bound, it does not remove it.
    const guard = build({ maxTokenLength: undefined, maxHeaderLength: undefined, maxDepth: undefined });
    const huge = await guard.verify(makeToken({ claims: { pad: 'x'.repeat(9000) } }));
    expect(code(huge)).toBe('token_too_large');
    const oversized = await guard.authenticate({ headers: { authorization: `Bearer ${'a'.repeat(9000)}` } });
    expect(code(oversized)).toBe('token_too_large');
    expect(code(await build({ maxTokenLength: 16_384 }).verify(makeToken({ claims: { pad: 'x'.repeat(9000) } })))).toBe(
      'ok',
    );
  });

  it('a cached token dies at iat + maxTokenAge when that comes before exp', async () => {
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [{ issuer: ISSUER, secret: SECRET, maxTokenAge: 60 }],
    });
    const token = makeToken({ claims: { exp: clock.seconds() + 3600 } });
    expect(code(await guard.verify(token))).toBe('ok');
    expect(code(await guard.verify(token))).toBe('ok');
    expect(guard.stats().cacheHits).toBe(1);
    // Past maxTokenAge plus the 5 s tolerance: the cache must not answer for it.
    clock.advance(66);
    expect(code(await guard.verify(token))).toBe('token_too_old');
    expect(guard.stats().cacheHits).toBe(1);
  });

  it('with no clock tolerance a cached token dies exactly at exp, as an uncached one does', async () => {
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [{ issuer: ISSUER, secret: SECRET, clockTolerance: 0 }],
    });
    const token = makeToken({ claims: { exp: clock.seconds() + 10 } });
    expect(code(await guard.verify(token))).toBe('ok');
    clock.advance(10);
    expect(code(await guard.verify(token))).toBe('token_expired');
    expect(guard.stats().cacheHits).toBe(0);
  });

  it('limits are inclusive: a token of exactly maxTokenLength, a header of exactly maxHeaderLength pass', async () => {
    const token = makeToken();
    const headerLength = token.indexOf('.');
    const build = (limits: Record<string, number>) =>
      createGuard({
        audience: AUDIENCE,
        now: manualClock().now,
        limits,
        issuers: [{ issuer: ISSUER, secret: SECRET }],
      });
    expect(code(await build({ maxTokenLength: token.length }).verify(token))).toBe('ok');
    expect(code(await build({ maxTokenLength: token.length - 1 }).verify(token))).toBe('token_too_large');
    expect(code(await build({ maxHeaderLength: headerLength }).verify(token))).toBe('ok');
    expect(code(await build({ maxHeaderLength: headerLength - 1 }).verify(token))).toBe('token_too_large');
  });

  it('verify and authenticate answer bad input from JavaScript callers with a refusal, never a throw', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    for (const token of [undefined, null, 42, {}, ['a.b.c']]) {
      expect(code(await guard.verify(token as never)), String(token)).toBe('token_malformed');
    }
    for (const request of [undefined, null, {}, { headers: null }, 'Bearer x', { headers: { authorization: 42 } }]) {
      expect(code(await guard.authenticate(request as never)), JSON.stringify(request)).toBe('token_missing');
    }
    const lenient = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      allowQueryToken: true,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    expect(code(await lenient.authenticate({ headers: {}, url: 7 } as never))).toBe('token_missing');
    const internal = createInternalVerifier({
      issuer: ISSUER,
      audience: AUDIENCE,
      jwks: createInternalTokenIssuer({ issuer: ISSUER }).jwks(),
    });
    expect(code(await internal.authenticate({ headers: { 'idem-internal-token': 42 } } as never))).toBe(
      'token_missing',
    );
    expect(code(await internal.authenticate(undefined as never))).toBe('token_missing');
  });

  it('guardRequestFromNode keeps both Authorization and DPoP values from headersDistinct', () => {
    const request = guardRequestFromNode(
      {
        headers: { authorization: 'Bearer a', host: 'api.example', dpop: 'p1' },
        headersDistinct: { authorization: ['Bearer a', 'Bearer b'], dpop: ['p1'], host: ['api.example'] },
        url: '/x',
        method: 'POST',
      },
      { url: '/mounted/x' },
    );
    expect(request).toEqual({
      headers: { authorization: ['Bearer a', 'Bearer b'], host: 'api.example', dpop: 'p1' },
      url: '/mounted/x',
      method: 'POST',
    });
  });
});

describe('carriesCredentials and optionalGuard: what an optional guard lets through as anonymous', () => {
  const issuers = [{ issuer: ISSUER, secret: SECRET }];

  it('a bearer guard: any Authorization header, a DPoP header where DPoP is on, a query token where it reads one', () => {
    const plain = createGuard({ audience: AUDIENCE, issuers });
    const carries = (headers: Record<string, string | string[]>, url?: string) =>
      plain.carriesCredentials({ headers, ...(url === undefined ? {} : { url }) });
    expect(carries({})).toBe(false);
    expect(carries({ authorization: 'Bearer x' })).toBe(true);
    expect(carries({ authorization: 'Basic x' })).toBe(true);
    expect(carries({ authorization: '' })).toBe(true);
    expect(carries({ authorization: ['a', 'b'] })).toBe(true);
    // DPoP and query tokens are no credentials of a guard that does not take them.
    expect(carries({ dpop: 'proof' })).toBe(false);
    expect(carries({}, '/x?access_token=abc')).toBe(false);
    const dpop = createGuard({ audience: AUDIENCE, issuers, dpop: {} });
    expect(dpop.carriesCredentials({ headers: { dpop: 'proof' } })).toBe(true);
    const query = createGuard({ audience: AUDIENCE, issuers, allowQueryToken: true });
    expect(query.carriesCredentials({ headers: {}, url: '/x?a=1&access_token=' })).toBe(true);
    expect(query.carriesCredentials({ headers: {}, url: '/x?a=1' })).toBe(false);
    // Not a request at all carries nothing (as authenticate reads it as one without a token).
    expect(plain.carriesCredentials(null as never)).toBe(false);
  });

  it('an internal verifier: its own token header only', () => {
    const verifier = createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders',
      jwks: createInternalTokenIssuer({ issuer: 'https://gateway.example' }).jwks(),
    });
    expect(verifier.carriesCredentials({ headers: { [verifier.tokenHeader]: 'x' } })).toBe(true);
    expect(verifier.carriesCredentials({ headers: { authorization: 'Bearer x' } })).toBe(false);
  });

  it('optionalGuard checks the glue options once: a boolean, and a guard that can tell an anonymous request', () => {
    const guard = createGuard({ audience: AUDIENCE, issuers });
    expect(optionalGuard(undefined, guard)).toBe(false);
    expect(optionalGuard({}, guard)).toBe(false);
    expect(optionalGuard({ optional: true }, guard)).toBe(true);
    expect(() => optionalGuard({ optional: 'yes' as never }, guard)).toThrow(/optional must be a boolean/);
    expect(() => optionalGuard(null as never, guard)).toThrow(TypeError);
    const homemade = { ...guard, carriesCredentials: undefined } as never;
    expect(() => optionalGuard({ optional: true }, homemade)).toThrow(/carriesCredentials/);
    expect(optionalGuard({ optional: false }, homemade)).toBe(false);
  });
});
