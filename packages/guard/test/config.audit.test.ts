// Configuration-mistake audit of createGuard. Each test states what a user expects from a wrong
// option: a TypeError at construction naming it, or the documented meaning. `it.fails` marks a
// defect that still exists.
import { describe, expect, it } from 'vitest';
import { createGuard, type Guard, type GuardOptions } from '../src/index.js';
import { startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET, testKeys } from './support/tokens.js';

const clock = manualClock();
const base = (extra: Partial<GuardOptions> = {}): GuardOptions => ({
  audience: AUDIENCE,
  now: clock.now,
  issuers: [{ issuer: ISSUER, secret: SECRET }],
  ...extra,
});

// Builds with `make`; a TypeError that names `option` is the right answer, else `check` must pass.
async function refusedOrHonoured(option: string, make: () => Guard, check: (guard: Guard) => Promise<void>) {
  let guard: Guard;
  try {
    guard = make();
  } catch (error) {
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toContain(option);
    return;
  }
  await guard.ready();
  await check(guard);
}

describe('createGuard options: configuration mistakes', () => {
  // Was a defect: `requiredClaims: 'jti'` (a string, as `audience` may be) is spread into the claims
  // 'j', 't' and 'i': every valid token carrying `jti` is refused 401 claim_invalid; expected: the
  // string read as one claim name (as `audience` is), or a TypeError naming requiredClaims.
  it('requiredClaims given as a string is one claim, not its letters', async () => {
    await refusedOrHonoured(
      'requiredClaims',
      () => createGuard(base({ requiredClaims: 'jti' as never })),
      async (guard) => {
        const result = await guard.verify(makeToken({ now: clock.now() }));
        expect(result.ok ? 'ok' : result.error.code).toBe('ok');
      },
    );
  });

  // Was a defect: `dpop: { required: 'true' }` (a string) is accepted and read as false, so plain
  // bearer tokens are let through where the operator asked for DPoP only: a bound lifted by a typo;
  // expected: a TypeError naming dpop.required (the idempotency `required` refuses a non-boolean).
  it('dpop.required that is not a boolean is refused, never read as "not required"', async () => {
    await refusedOrHonoured(
      'dpop.required',
      () => createGuard(base({ dpop: { required: 'true' as never } })),
      async (guard) => {
        const token = makeToken({ now: clock.now() });
        const result = await guard.authenticate({ headers: { authorization: `Bearer ${token}` } });
        expect(result.ok).toBe(false);
      },
    );
  });

  // Was a defect: `typ: []` is accepted, and then no `typ` matches: every token is refused 401
  // type_invalid, per request; expected: a TypeError naming typ (as `algorithms: []` and
  // `dpop.algorithms: []` are refused).
  it('an empty typ list is refused at construction', () => {
    expect(() => createGuard(base({ typ: [] }))).toThrow(/typ/);
  });

  // Was a defect: `jwksOptions.timeout: 0` is accepted (`seconds()` allows 0), and every JWKS fetch is
  // then aborted at once: no key is ever loaded and every token is refused; expected: a TypeError
  // naming the jwks timeout (a positive number of seconds).
  it('a jwks timeout of 0 is refused rather than aborting every fetch', async () => {
    const keys = testKeys();
    const server = await startJwksServer({
      kind: 'json',
      body: { keys: [{ ...keys.ec.publicJwk, kid: 'ec', alg: 'ES256', use: 'sig' }] },
    });
    try {
      await refusedOrHonoured(
        'timeout',
        () =>
          createGuard({
            audience: AUDIENCE,
            issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'], jwksOptions: { timeout: 0 } }],
          }),
        async (guard) => {
          const token = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'ec' }, now: Date.now() });
          const result = await guard.verify(token);
          expect(result.ok ? 'ok' : result.error.code).toBe('ok');
        },
      );
    } finally {
      await server.close();
    }
  });
});
