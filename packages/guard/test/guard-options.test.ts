import { describe, expect, it } from 'vitest';
import { createGuard, type GuardResult, guardRequestFromNode, isGuard } from '../src/index.js';
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

  it('refuses duplicate kids, private material and mixed secrets at construction', () => {
    const base = { audience: AUDIENCE };
    expect(() =>
      createGuard({
        ...base,
        issuers: [
          {
            issuer: ISSUER,
            publicKeys: [
              { ...keys.ec.publicJwk, kid: 'a' },
              { ...keys.ed.publicJwk, kid: 'a' },
            ],
          },
        ],
      }),
    ).toThrow(/duplicate kid/);
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
