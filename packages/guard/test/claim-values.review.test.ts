import { describe, expect, it } from 'vitest';
import { createGuard, type GuardResult, type IssuerOptions } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

// Review of claimValues (and requiredClaims, which checkClaims walks beside it) with claim names that
// are also the names of Object.prototype's members. A JWT may carry any member name (RFC 7519 §4.3,
// private claims); a rule on `constructor` or `toString` is a rule on that claim of the token, not
// on what every JavaScript object inherits.

function guardWith(issuer: Partial<IssuerOptions>) {
  return createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    cache: false,
    issuers: [{ issuer: ISSUER, secret: SECRET, ...issuer }],
  });
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('claim rules on names Object.prototype also has (review)', () => {
  it('claimValues takes a claim named constructor or toString, and compares the claim the token carries', async () => {
    for (const name of ['constructor', 'toString', 'hasOwnProperty', 'valueOf']) {
      // A computed key: an own member, as JSON.parse makes one from a token's payload.
      const guard = guardWith({ claimValues: { [name]: 'yes' } });
      const payload = JSON.parse(`{"${name}":"yes"}`) as Record<string, unknown>;
      expect(code(await guard.verify(makeToken({ claims: payload }))), name).toBe('ok');
      expect(code(await guard.verify(makeToken())), name).toBe('claim_invalid');
    }
  });

  it('claimValues refuses __proto__ at construction, by name (the token parser refuses that member)', () => {
    expect(() => guardWith({ claimValues: JSON.parse('{"__proto__":"yes"}') })).toThrow(
      /claimValues cannot rule on __proto__ \(no token has it\)/,
    );
  });

  it('requiredClaims refuses a token without the claim, whatever its name', async () => {
    for (const name of ['constructor', 'toString', 'valueOf']) {
      const guard = guardWith({ requiredClaims: [name] });
      expect(code(await guard.verify(makeToken())), name).toBe('claim_invalid');
      const payload = JSON.parse(`{"${name}":"x"}`) as Record<string, unknown>;
      expect(code(await guard.verify(makeToken({ claims: payload }))), name).toBe('ok');
    }
  });
});
