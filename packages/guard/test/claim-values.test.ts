import { describe, expect, it } from 'vitest';
import { createGuard, type GuardOptions, type GuardResult, type IssuerOptions } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

// `claimValues`: claims that must hold given values, per issuer or for all. Without it, a rule such
// as Keycloak's `typ: Bearer` (its ID tokens say `typ: ID`) or Cognito's `token_use: access` needed
// a policy() on every route, and a route that forgot it took the other kind of token.

function guardWith(issuer: Partial<IssuerOptions> = {}, options: Partial<GuardOptions> = {}) {
  return createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    cache: false,
    ...options,
    issuers: [{ issuer: ISSUER, secret: SECRET, ...issuer }],
  });
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('claimValues', () => {
  it('refuses a token whose claim holds another value, or none, with claim_invalid', async () => {
    const guard = guardWith({ claimValues: { typ: 'Bearer' } });
    expect(code(await guard.verify(makeToken({ claims: { typ: 'Bearer' } })))).toBe('ok');
    expect(code(await guard.verify(makeToken({ claims: { typ: 'ID' } })))).toBe('claim_invalid');
    expect(code(await guard.verify(makeToken()))).toBe('claim_invalid');
    // Compared exactly: no case folding, no type coercion, no membership in an array claim.
    expect(code(await guard.verify(makeToken({ claims: { typ: 'bearer' } })))).toBe('claim_invalid');
    expect(code(await guard.verify(makeToken({ claims: { typ: ['Bearer'] } })))).toBe('claim_invalid');
  });

  it('takes a list of accepted values, and numbers and booleans compared by type', async () => {
    const guard = guardWith({ claimValues: { token_use: ['access', 'service'], ver: 2, email_verified: true } });
    const base = { token_use: 'access', ver: 2, email_verified: true };
    expect(code(await guard.verify(makeToken({ claims: base })))).toBe('ok');
    expect(code(await guard.verify(makeToken({ claims: { ...base, token_use: 'service' } })))).toBe('ok');
    expect(code(await guard.verify(makeToken({ claims: { ...base, token_use: 'id' } })))).toBe('claim_invalid');
    expect(code(await guard.verify(makeToken({ claims: { ...base, ver: '2' } })))).toBe('claim_invalid');
    expect(code(await guard.verify(makeToken({ claims: { ...base, email_verified: 'true' } })))).toBe('claim_invalid');
  });

  it('applies a guard-wide rule to every issuer, and an issuer of its own replaces it', async () => {
    const other = 'https://other.example';
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      cache: false,
      claimValues: { tenant: 'acme' },
      issuers: [
        { issuer: ISSUER, secret: SECRET },
        { issuer: other, secret: SECRET, claimValues: { tenant: 'globex' } },
      ],
    });
    expect(code(await guard.verify(makeToken({ claims: { tenant: 'acme' } })))).toBe('ok');
    expect(code(await guard.verify(makeToken({ claims: { tenant: 'globex' } })))).toBe('claim_invalid');
    expect(code(await guard.verify(makeToken({ claims: { iss: other, tenant: 'globex' } })))).toBe('ok');
    expect(code(await guard.verify(makeToken({ claims: { iss: other, tenant: 'acme' } })))).toBe('claim_invalid');
  });

  it('refuses at construction a rule that could never be met or that another option owns', () => {
    const bad: unknown[] = [
      'typ',
      ['typ'],
      { '': 'x' },
      { typ: undefined },
      { typ: null },
      { typ: {} },
      { typ: [] },
      { typ: [['Bearer']] },
      { ver: Number.NaN },
      { ver: Number.POSITIVE_INFINITY },
    ];
    for (const claimValues of bad) {
      expect(() => guardWith({ claimValues } as Partial<IssuerOptions>), JSON.stringify(claimValues)).toThrow(
        /claimValues/,
      );
    }
    // Claims with rules of their own: the option that owns each is named.
    for (const name of ['iss', 'aud', 'exp', 'nbf', 'iat', 'cnf']) {
      expect(() => guardWith({ claimValues: { [name]: 'x' } }), name).toThrow(/claimValues/);
    }
  });
});
