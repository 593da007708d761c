import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  type GuardEvent,
  principalFromClaims,
  requireScopes,
} from '../src/index.js';
import { importKeySet } from '../src/key-import.js';
import { AUDIENCE, ISSUER, manualClock, SECRET } from './support/tokens.js';

// Tests written by a mutation-testing pass over guard.ts (since split into guard.ts, guard-options.ts,
// option-checks.ts, static-keys.ts, issuer.ts, engine.ts and verify.ts), internal-signing-keys.ts and
// key-import.ts: each kills a mutant the other tests let live (named in its comment).

function edge() {
  const events: GuardEvent[] = [];
  const guard = createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    onEvent: (event) => events.push(event),
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  return { guard, events };
}

describe('guard events (mutants)', () => {
  // Kills: guard.error() no longer telling and counting the refusal.
  it('error(code) is a rejected event and is counted, as any other refusal', () => {
    const { guard, events } = edge();
    const error = guard.error('token_missing');
    expect(error.code).toBe('token_missing');
    expect(events).toMatchObject([{ type: 'rejected', code: 'token_missing' }]);
    expect(guard.stats().rejected.token_missing).toBe(1);
  });

  // Kills: the issuer left off an authorize() rejection, or put on one whose principal has none.
  it("an authorize() refusal names the principal's issuer, and no issuer when the principal has none", () => {
    const { guard, events } = edge();
    const known = principalFromClaims({ sub: 'u1', iss: ISSUER, aud: AUDIENCE, scope: 'a' });
    const anonymous = principalFromClaims({ sub: 'u2', iss: '', aud: AUDIENCE, scope: 'a' });
    expect(guard.authorize(known, [requireScopes('b')]).ok).toBe(false);
    expect(guard.authorize(anonymous, [requireScopes('b')]).ok).toBe(false);
    expect(events).toHaveLength(2);
    expect(events[0]).toMatchObject({ type: 'rejected', code: 'insufficient_scope', issuer: ISSUER });
    expect(events[1]).toMatchObject({ type: 'rejected', code: 'insufficient_scope' });
    expect(events[1]).not.toHaveProperty('issuer');
  });
});

describe('internal signing keys (mutants)', () => {
  // Kills: every rotation withdrawing the keys before it, delayed or not (only delay: 0 withdraws).
  it('rotations with a delay keep maxPublishedKeys published long after their tokens died', () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: 'https://gw', maxPublishedKeys: 3, now: clock.now });
    const first = issuer.currentKid;
    const second = issuer.rotate();
    clock.advance(100);
    const third = issuer.rotate();
    clock.advance(10_000);
    expect(issuer.currentKid).toBe(third);
    expect(issuer.jwks().keys.map((key) => key.kid)).toEqual([third, second, first]);
  });
});

describe('key sets (mutants)', () => {
  // Kills: keys without a kid counted as sharing one (two kid-less keys would refuse the set).
  it('two usable keys without a kid are not a duplicate kid', async () => {
    const jwk = () => ({ ...generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }), alg: 'EdDSA' });
    const result = await importKeySet({ keys: [jwk(), jwk()] }, { algorithms: ['EdDSA'], allowSymmetric: false });
    expect(result.ok && result.keys.length).toBe(2);
  });
});
