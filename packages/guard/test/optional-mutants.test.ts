import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  type Guard,
  type GuardRequest,
  optionalGuard,
} from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, SECRET } from './support/tokens.js';

// What an optional guard lets through as anonymous, where the first tests left it open. The promise
// is two-sided: a request that carries nothing this guard reads is anonymous, and an anonymous
// request is exactly one `authenticate` would answer `token_missing` (no credential at all). The
// second half is checked below over many request shapes, for every kind of guard.

const issuers = [{ issuer: ISSUER, secret: SECRET }];
const token = makeToken({ now: Date.now() });

const guards: Array<[string, Guard]> = [
  ['bearer', createGuard({ audience: AUDIENCE, issuers })],
  ['query tokens', createGuard({ audience: AUDIENCE, issuers, allowQueryToken: true })],
  ['DPoP allowed', createGuard({ audience: AUDIENCE, issuers, dpop: {} })],
  ['DPoP required', createGuard({ audience: AUDIENCE, issuers, dpop: { required: true } })],
  ['DPoP nonces', createGuard({ audience: AUDIENCE, issuers, dpop: { nonce: true } })],
  [
    'internal verifier',
    createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders',
      jwks: createInternalTokenIssuer({ issuer: 'https://gateway.example' }).jwks(),
    }),
  ],
];

const requests: GuardRequest[] = [
  { headers: {} },
  { headers: {}, method: 'OPTIONS', url: '/orders' },
  { headers: {}, method: 'POST', url: '/orders' },
  { headers: {}, url: '/orders?access_token=' },
  { headers: {}, url: `/orders?access_token=${token}` },
  { headers: {}, url: '/orders?access_token' },
  { headers: {}, url: `/orders?a=1&access_token=${token}&access_token=${token}` },
  { headers: {}, url: `/orders&access_token=${token}` },
  { headers: {}, url: `/orders?ACCESS_TOKEN=${token}` },
  { headers: {}, url: `/orders?access%5Ftoken=${token}` },
  { headers: { authorization: `Bearer ${token}` } },
  { headers: { authorization: `Basic ${token}` } },
  { headers: { authorization: '' } },
  { headers: { authorization: [`Bearer ${token}`, `Bearer ${token}`] } },
  { headers: { dpop: 'x.y.z' } },
  { headers: { dpop: '' } },
  { headers: { 'idem-internal-token': token } },
  { headers: { cookie: `access_token=${token}` } },
];

const describeRequest = (request: GuardRequest) =>
  `${request.method ?? 'GET'} ${request.url ?? '(no url)'} ${Object.keys(request.headers).join(',')}`;

describe('optional guards: what counts as anonymous', () => {
  for (const [label, guard] of guards) {
    it(`${label}: a request it calls anonymous is one authenticate answers token_missing, never one it would verify`, async () => {
      for (const request of requests) {
        if (guard.carriesCredentials(request)) continue;
        // The method and URL glue always passes (a guard with `dpop` refuses a call without them as misuse).
        const result = await guard.authenticate({ method: 'GET', url: '/', ...request });
        expect(result.ok ? 'ok' : result.error.code, `${label}: ${describeRequest(request)}`).toBe('token_missing');
      }
    });
  }

  it('a guard that reads query tokens: no URL, a URL without a query, or another parameter is anonymous; `access_token` in any form is not', () => {
    const guard = guards[1]?.[1] as Guard;
    expect(guard.carriesCredentials({ headers: {} })).toBe(false);
    // `&access_token=` in the path is part of the path, not a query parameter.
    expect(guard.carriesCredentials({ headers: {}, url: `/orders&access_token=${token}` })).toBe(false);
    expect(guard.carriesCredentials({ headers: {}, url: `/orders?ACCESS_TOKEN=${token}` })).toBe(false);
    expect(guard.carriesCredentials({ headers: {}, url: '/orders?access_token' })).toBe(true);
    expect(guard.carriesCredentials({ headers: {}, url: `/orders?access%5Ftoken=${token}` })).toBe(true);
  });

  it('the method never makes a request carry a credential: an anonymous preflight or write is anonymous', () => {
    for (const [label, guard] of guards) {
      for (const method of ['OPTIONS', 'POST', 'DELETE']) {
        expect(guard.carriesCredentials({ headers: {}, method, url: '/orders' }), `${label} ${method}`).toBe(false);
      }
    }
  });

  it('optionalGuard refuses glue options that are not an object (a bare `true` is a mistake, not a setting)', () => {
    const guard = guards[0]?.[1] as Guard;
    for (const bad of [true, false, 'optional', 1]) {
      expect(() => optionalGuard(bad as never, guard), String(bad)).toThrow(/must be an object/);
    }
  });
});
