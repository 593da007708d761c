// Audit (internationalisation): claims, issuers and headers outside ASCII at the guard. Claims keep
// their exact text from the edge token through the internal token to the principal downstream;
// names are compared exactly (no normalisation, no case folding: authorization is not fuzzy); a
// challenge is ASCII whatever the refusal, as RFC 6750 §3 requires; bytes that are no UTF-8 or no
// token are a 4xx, never a throw.
import { describe, expect, it } from 'vitest';
import {
  authorizeRequest,
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  GuardError,
  type GuardErrorCode,
  guardErrorTable,
  requireRoles,
  requireScopes,
} from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

const GATEWAY = 'https://gateway.example';
const ascii = /^[\x20-\x7e]*$/;

const claims = {
  sub: 'zoë-åström',
  name: 'Zoë Åström 🎉',
  email: 'zoë@bücher.example',
  roles: ['Rédacteur', '編集者'],
  scope: 'orders:read commandes:écrire',
};

function guardFor(issuer = ISSUER) {
  return createGuard({ audience: AUDIENCE, now: manualClock().now, issuers: [{ issuer, secret: SECRET }] });
}

describe('non-ASCII claims', () => {
  it('reach the principal and, through the internal token, the principal downstream exactly', async () => {
    const clock = manualClock();
    const edge = await guardFor().verify(makeToken({ claims }));
    if (!edge.ok) throw new Error(edge.error.code);
    expect(edge.principal.sub).toBe(claims.sub);
    expect([...edge.principal.roles]).toEqual(claims.roles);
    expect([...edge.principal.scope]).toEqual(['orders:read', 'commandes:écrire']);

    const internal = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now, claims: ['name', 'email'] });
    const token = await internal.mint(edge.principal, { audience: 'orders' });
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: internal.jwks(),
      now: clock.now,
    });
    const downstream = await verifier.authenticate({ headers: { 'idem-internal-token': token } });
    if (!downstream.ok) throw new Error(downstream.error.code);
    expect(downstream.principal.sub).toBe(claims.sub);
    expect(downstream.principal.claims.name).toBe(claims.name);
    expect(downstream.principal.claims.email).toBe(claims.email);
    expect([...downstream.principal.roles]).toEqual(claims.roles);
  });

  it('compares role names exactly: the NFC role passes, its NFD spelling does not, and the 403 challenge is ASCII', async () => {
    const edge = await guardFor().verify(makeToken({ claims }));
    if (!edge.ok) throw new Error(edge.error.code);
    expect(authorizeRequest(edge.principal, [requireRoles('編集者')], { headers: {} }).ok).toBe(true);
    const refused = authorizeRequest(edge.principal, [requireRoles('Rédacteur'.normalize('NFD'))], { headers: {} });
    expect(refused.ok).toBe(false);
    if (refused.ok) return;
    expect(refused.error.status).toBe(403);
    expect(refused.error.wwwAuthenticate).toMatch(ascii);
  });

  it('refuses, when the rule is made, a required scope that no challenge could name (RFC 6749 scope tokens are ASCII)', () => {
    expect(() => requireScopes('commandes:écrire')).toThrow(TypeError);
  });
});

describe('challenges and problem bodies', () => {
  it('every refusal has an ASCII WWW-Authenticate and an ASCII detail', () => {
    for (const code of Object.keys(guardErrorTable) as GuardErrorCode[]) {
      const error = new GuardError(code, { realm: 'orders', scope: ['orders:write'], dpopAlgorithms: ['ES256'] });
      expect(error.wwwAuthenticate, code).toMatch(ascii);
      expect(error.toProblem().detail, code).toMatch(ascii);
      expect(error.toProblem().title, code).toMatch(ascii);
    }
  });

  it('refuses a realm or resource metadata URL outside ASCII when the guard is made, not on the first 401', () => {
    expect(() =>
      createGuard({ audience: AUDIENCE, realm: 'bücher', issuers: [{ issuer: ISSUER, secret: SECRET }] }),
    ).toThrow(TypeError);
    expect(() =>
      createGuard({
        audience: AUDIENCE,
        resourceMetadata: 'https://bücher.example/.well-known/oauth-protected-resource',
        issuers: [{ issuer: ISSUER, secret: SECRET }],
      }),
    ).toThrow(TypeError);
  });
});

describe('issuers with internationalised domain names', () => {
  const unicode = 'https://bücher.example';
  const punycode = 'https://xn--bcher-kva.example';

  it('match `iss` exactly as configured: the same spelling passes, the other spelling of the host does not', async () => {
    const guard = guardFor(unicode);
    const same = await guard.verify(makeToken({ claims: { iss: unicode } }));
    expect(same.ok).toBe(true);
    const other = await guard.verify(makeToken({ claims: { iss: punycode } }));
    expect(other.ok ? 'ok' : other.error.code).toBe('issuer_unknown');
  });
});

describe('bytes that are no token', () => {
  it.each([
    ['a latin1 byte in the token (Node gives it as U+00E9)', `Bearer ${makeToken()}\u00e9`],
    ['UTF-8 bytes read as latin1', `Bearer ${Buffer.from('tökén').toString('latin1')}`],
    ['a scheme spelt with a non-ASCII letter', `Beårer ${makeToken()}`],
  ])('%s: a 4xx refusal, never a throw', async (_what, authorization) => {
    const result = await guardFor().authenticate({ headers: { authorization } });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect([400, 401]).toContain(result.error.status);
    expect(result.error.wwwAuthenticate).toMatch(ascii);
  });

  it.each([
    [
      'invalid UTF-8 in the payload',
      new Uint8Array([0x7b, 0x22, 0x73, 0x75, 0x62, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]),
    ],
    ['a BOM before the payload JSON', `\ufeff${JSON.stringify({ iss: ISSUER, aud: AUDIENCE, sub: 'a', exp: 9e9 })}`],
  ])('a signed token with %s is refused 401', async (_what, rawPayload) => {
    const result = await guardFor().verify(makeToken({ rawPayload }));
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.status).toBe(401);
  });
});
