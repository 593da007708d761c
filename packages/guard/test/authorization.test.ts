import { describe, expect, it, vi } from 'vitest';
import {
  authorizeRequest,
  createGuard,
  GuardError,
  type GuardErrorCode,
  type GuardEvent,
  guardErrorTable,
  isGuardError,
  policy,
  principalFromClaims,
  requireAnyRole,
  requireAuthentication,
  requireRoles,
  requireScopes,
} from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

const principal = principalFromClaims({
  sub: 'u1',
  iss: ISSUER,
  aud: AUDIENCE,
  scope: 'orders:read orders:write',
  roles: ['editor'],
  tenant: 't1',
});

// A guard with a guard-wide clock tolerance of 10 s and an issuer of its own 30 s, on a hand-moved
// clock, and whether a token of `issuer` with `authTime` passes requireAuthentication({ maxAge: 300 }).
function stepUpGuard() {
  const clock = manualClock();
  const nowSeconds = clock.seconds();
  const rule = requireAuthentication({ maxAge: 300 });
  const guard = createGuard({
    audience: AUDIENCE,
    clockTolerance: 10,
    now: clock.now,
    issuers: [
      { issuer: ISSUER, secret: SECRET },
      { issuer: 'https://slow.example', secret: SECRET, clockTolerance: 30 },
    ],
  });
  const decide = async (issuer: string, authTime: number) => {
    const verified = await guard.verify(
      makeToken({ claims: { iss: issuer, jti: `${issuer}${authTime}`, auth_time: authTime } }),
    );
    if (!verified.ok) throw verified.error;
    return guard.authorize(verified.principal, [rule]).ok;
  };
  return { nowSeconds, guard, rule, decide };
}

describe('authorization', () => {
  it('case 48: a missing scope is 403 insufficient_scope naming the needed scopes', () => {
    const decision = authorizeRequest(
      principal,
      [requireScopes('orders:read', 'admin:all')],
      { headers: {} },
      { realm: 'orders' },
    );
    expect(decision.ok).toBe(false);
    if (!decision.ok) {
      expect(decision.error.status).toBe(403);
      expect(decision.error.code).toBe('insufficient_scope');
      expect(decision.error.wwwAuthenticate).toBe(
        'Bearer realm="orders", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:read admin:all"',
      );
    }
    expect(authorizeRequest(principal, [requireScopes('orders:write')], { headers: {} }).ok).toBe(true);
  });

  it('case 49: scope as a string and scp as an array give the same decision', () => {
    const fromScp = principalFromClaims({ sub: 'u', iss: ISSUER, aud: AUDIENCE, scp: ['orders:read', 'orders:write'] });
    const fromString = principalFromClaims({
      sub: 'u',
      iss: ISSUER,
      aud: AUDIENCE,
      scope: 'orders:read  orders:write',
    });
    for (const requirement of [requireScopes('orders:write'), requireScopes('admin')]) {
      expect(authorizeRequest(fromScp, [requirement], { headers: {} }).ok).toBe(
        authorizeRequest(fromString, [requirement], { headers: {} }).ok,
      );
    }
    expect([...fromScp.scope]).toEqual([...fromString.scope]);
  });

  it('roles (all and any) and attribute policies; a throwing policy refuses', () => {
    const check = (...requirements: Parameters<typeof authorizeRequest>[1]) =>
      authorizeRequest(principal, requirements, { headers: {}, url: '/tenants/t1/orders', method: 'POST' }).ok;
    expect(check(requireRoles('editor'))).toBe(true);
    expect(check(requireRoles('editor', 'admin'))).toBe(false);
    expect(check(requireAnyRole('admin', 'editor'))).toBe(true);
    expect(check(policy((p, request) => request.url?.startsWith(`/tenants/${p.claims.tenant}/`) === true))).toBe(true);
    expect(check(policy(() => false))).toBe(false);
    expect(
      check(
        policy(() => {
          throw new Error('boom');
        }),
      ),
    ).toBe(false);
    // Only `true` allows: an async predicate (a Promise, always truthy) or a truthy value fails closed.
    for (const answer of [Promise.resolve(true), 'yes', 1, {}]) {
      expect(check(policy(() => answer as unknown as boolean)), String(answer)).toBe(false);
    }
    const refused = authorizeRequest(principal, [requireRoles('admin')], { headers: {} });
    expect(!refused.ok && refused.error.wwwAuthenticate).toBe(
      'Bearer realm="api", error="insufficient_scope", error_description="The access token lacks the privileges this request needs"',
    );
  });

  it('step-up (RFC 9470): a weak or old login is 401 insufficient_user_authentication with acr_values and max_age', () => {
    const now = () => 1_800_000_000_000;
    const user = (claims: Record<string, unknown>) =>
      principalFromClaims({ sub: 'u', iss: ISSUER, aud: AUDIENCE, ...claims });
    const rule = requireAuthentication({ acrValues: ['urn:example:mfa'], maxAge: 300 });
    const fresh = user({ acr: 'urn:example:mfa', auth_time: 1_800_000_000 - 100 });
    expect(authorizeRequest(fresh, [rule], { headers: {} }, { now }).ok).toBe(true);
    // A login exactly maxAge old is still recent enough (RFC 9470 max_age: the allowed elapsed time).
    const edge = user({ acr: 'urn:example:mfa', auth_time: 1_800_000_000 - 300 });
    expect(authorizeRequest(edge, [rule], { headers: {} }, { now }).ok).toBe(true);
    for (const claims of [
      { acr: 'urn:example:pwd', auth_time: 1_800_000_000 - 100 },
      // maxAge plus the default clock tolerance (5 s), and one second more.
      { acr: 'urn:example:mfa', auth_time: 1_800_000_000 - 306 },
      { acr: 'urn:example:mfa' },
      { auth_time: 1_800_000_000 },
    ]) {
      const decision = authorizeRequest(user(claims), [rule], { headers: {} }, { now, realm: 'bank' });
      expect(decision.ok).toBe(false);
      if (!decision.ok) {
        expect(decision.error.status).toBe(401);
        expect(decision.error.wwwAuthenticate).toBe(
          'Bearer realm="bank", error="insufficient_user_authentication", error_description="A more recent or stronger user authentication is required", acr_values="urn:example:mfa", max_age="300"',
        );
      }
    }
    expect(() => requireAuthentication({})).toThrow(TypeError);
    expect(() => requireAuthentication({ acrValues: ['a b'] })).toThrow(TypeError);
    expect(() => requireAuthentication({ acrValues: [] })).toThrow(TypeError);
    expect(() => requireAuthentication({ maxAge: -1 })).toThrow(TypeError);
    expect(() => requireAuthentication({ maxAge: 1.5 })).toThrow(TypeError);
    expect(requireAuthentication({ maxAge: 0 })).toMatchObject({ kind: 'authentication', maxAge: 0 });
    // An auth_time that is not a whole number of seconds is no login time at all.
    const fractional = user({ acr: 'urn:example:mfa', auth_time: 1_800_000_000 - 100.5 });
    expect(authorizeRequest(fractional, [rule], { headers: {} }, { now }).ok).toBe(false);
  });

  it('step-up: an auth_time in the future passes only within the clock tolerance (default 5 s, as exp/nbf/iat)', () => {
    const nowSeconds = 1_800_000_000;
    const user = (authTime: number) =>
      principalFromClaims({ sub: 'u', iss: ISSUER, aud: AUDIENCE, auth_time: authTime });
    const rule = requireAuthentication({ maxAge: 300 });
    const decide = (authTime: number, options: { clockTolerance?: number; offsetMs?: number } = {}) => {
      const now = () => nowSeconds * 1000 + (options.offsetMs ?? 0);
      const tolerance = options.clockTolerance === undefined ? {} : { clockTolerance: options.clockTolerance };
      return authorizeRequest(user(authTime), [rule], { headers: {} }, { now, ...tolerance });
    };
    expect(decide(nowSeconds + 5).ok).toBe(true);
    const late = decide(nowSeconds + 6);
    expect(!late.ok && late.error.code).toBe('insufficient_user_authentication');
    expect(decide(nowSeconds, { clockTolerance: 0 }).ok).toBe(true);
    expect(decide(nowSeconds + 1, { clockTolerance: 0 }).ok).toBe(false);
    expect(decide(nowSeconds + 60, { clockTolerance: 60 }).ok).toBe(true);
    expect(decide(nowSeconds + 61, { clockTolerance: 60 }).ok).toBe(false);
    // Measured from the exact instant, as iat is: half a second past now + 5 is still beyond it.
    expect(decide(nowSeconds + 5, { offsetMs: 500 }).ok).toBe(true);
    expect(decide(nowSeconds + 6, { offsetMs: 500 }).ok).toBe(false);
    // Years ahead (an issuer writing milliseconds) is no recent login either.
    expect(decide(nowSeconds * 1000).ok).toBe(false);
    for (const clockTolerance of [-1, 61, Number.NaN, '5' as unknown as number]) {
      expect(() => decide(nowSeconds, { clockTolerance }), String(clockTolerance)).toThrow(TypeError);
    }
  });

  it('step-up: an auth_time just past maxAge passes within the clock tolerance, as a future one does', () => {
    // oauth4webapi and openid-client refuse only when auth_time + max_age < now - tolerance: the
    // issuer's clock may run behind ours in the past direction as much as in the future one.
    const nowSeconds = 1_800_000_000;
    const user = (authTime: number) =>
      principalFromClaims({ sub: 'u', iss: ISSUER, aud: AUDIENCE, auth_time: authTime });
    const decide = (
      authTime: number,
      options: { clockTolerance?: number; offsetMs?: number; maxAge?: number } = {},
    ) => {
      const now = () => nowSeconds * 1000 + (options.offsetMs ?? 0);
      const tolerance = options.clockTolerance === undefined ? {} : { clockTolerance: options.clockTolerance };
      const rule = requireAuthentication({ maxAge: options.maxAge ?? 300 });
      return authorizeRequest(user(authTime), [rule], { headers: {} }, { now, ...tolerance }).ok;
    };
    // The default tolerance, 5 s.
    expect(decide(nowSeconds - 300 - 3)).toBe(true);
    expect(decide(nowSeconds - 300 - 5)).toBe(true);
    expect(decide(nowSeconds - 300 - 6)).toBe(false);
    // clockTolerance 0: exactly maxAge, and not a second more.
    expect(decide(nowSeconds - 300, { clockTolerance: 0 })).toBe(true);
    expect(decide(nowSeconds - 301, { clockTolerance: 0 })).toBe(false);
    expect(decide(nowSeconds - 360, { clockTolerance: 60 })).toBe(true);
    expect(decide(nowSeconds - 361, { clockTolerance: 60 })).toBe(false);
    // Measured from the exact instant: half a second after the whole second, 305 s back is past it.
    expect(decide(nowSeconds - 304, { offsetMs: 500 })).toBe(true);
    expect(decide(nowSeconds - 305, { offsetMs: 500 })).toBe(false);
    // maxAge 0 (RFC 9470: a login made for this request) still allows the skew, both ways.
    expect(decide(nowSeconds - 5, { maxAge: 0 })).toBe(true);
    expect(decide(nowSeconds - 6, { maxAge: 0 })).toBe(false);
  });

  it("step-up through a guard: an auth_time past maxAge gets the clock tolerance of the token's issuer", async () => {
    const { nowSeconds, decide } = stepUpGuard();
    expect(await decide(ISSUER, nowSeconds - 310)).toBe(true);
    expect(await decide(ISSUER, nowSeconds - 311)).toBe(false);
    expect(await decide('https://slow.example', nowSeconds - 330)).toBe(true);
    expect(await decide('https://slow.example', nowSeconds - 331)).toBe(false);
  });

  // docs/guard.md: "`auth_time` is read only by this rule: token verification does not check it." A
  // token of an issuer that writes it oddly still authenticates; only a maxAge rule refuses it.
  it('auth_time is read only by requireAuthentication: verification takes any value, the maxAge rule refuses a bad one', async () => {
    const clock = manualClock();
    const guard = createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    for (const authTime of ['yesterday', -1, 1.5, clock.seconds() + 86_400, null, true]) {
      const verified = await guard.verify(makeToken({ claims: { auth_time: authTime, jti: `a${String(authTime)}` } }));
      expect(verified.ok ? 'ok' : verified.error.code, JSON.stringify(authTime)).toBe('ok');
      if (!verified.ok) continue;
      const decision = guard.authorize(verified.principal, [requireAuthentication({ maxAge: 300 })]);
      expect(decision.ok ? 'ok' : decision.error.code, JSON.stringify(authTime)).toBe(
        'insufficient_user_authentication',
      );
    }
  });

  it("step-up through a guard: a future auth_time gets the clock tolerance of the token's issuer", async () => {
    const { nowSeconds, guard, rule, decide } = stepUpGuard();
    expect(await decide(ISSUER, nowSeconds + 10)).toBe(true);
    expect(await decide(ISSUER, nowSeconds + 11)).toBe(false);
    expect(await decide('https://slow.example', nowSeconds + 30)).toBe(true);
    expect(await decide('https://slow.example', nowSeconds + 31)).toBe(false);
    // A principal from no configured issuer (built by hand) gets the guard-wide tolerance.
    const stranger = principalFromClaims({
      sub: 'u',
      iss: 'https://other.example',
      aud: AUDIENCE,
      auth_time: nowSeconds + 10,
    });
    expect(guard.authorize(stranger, [rule]).ok).toBe(true);
    const later = principalFromClaims({
      sub: 'u',
      iss: 'https://other.example',
      aud: AUDIENCE,
      auth_time: nowSeconds + 11,
    });
    expect(guard.authorize(later, [rule]).ok).toBe(false);
  });

  it('refuses scope names that cannot be placed in a challenge', () => {
    expect(() => requireScopes('a b')).toThrow(TypeError);
    expect(() => requireScopes('a"b')).toThrow(TypeError);
    expect(() => requireScopes()).toThrow(TypeError);
  });
});

describe('errors (case 54: nothing from the request is reflected)', () => {
  // Written out, not read from the table under test: a code moved to another status or RFC 6750
  // error (a 400 for a claim, a 500 for a store) fails here, whatever the table says.
  it('pins the status and RFC 6750 error of every code', () => {
    const expected: Record<GuardErrorCode, [number, string | undefined]> = {
      token_missing: [401, undefined],
      multiple_tokens: [400, 'invalid_request'],
      authorization_malformed: [400, 'invalid_request'],
      token_too_large: [400, 'invalid_request'],
      token_malformed: [401, 'invalid_token'],
      header_unsupported: [401, 'invalid_token'],
      type_invalid: [401, 'invalid_token'],
      algorithm_not_allowed: [401, 'invalid_token'],
      issuer_unknown: [401, 'invalid_token'],
      key_unknown: [401, 'invalid_token'],
      keys_unavailable: [401, 'invalid_token'],
      signature_invalid: [401, 'invalid_token'],
      token_expired: [401, 'invalid_token'],
      token_not_yet_valid: [401, 'invalid_token'],
      token_issued_in_future: [401, 'invalid_token'],
      token_too_old: [401, 'invalid_token'],
      lifetime_too_long: [401, 'invalid_token'],
      audience_invalid: [401, 'invalid_token'],
      claim_invalid: [401, 'invalid_token'],
      token_bound: [401, 'invalid_token'],
      dpop_proof_invalid: [401, 'invalid_dpop_proof'],
      dpop_proof_replayed: [401, 'invalid_dpop_proof'],
      dpop_replay_full: [401, 'invalid_dpop_proof'],
      dpop_replay_share_full: [401, 'invalid_dpop_proof'],
      dpop_nonce_required: [401, 'use_dpop_nonce'],
      dpop_replay_unavailable: [401, 'invalid_dpop_proof'],
      token_binding_invalid: [401, 'invalid_token'],
      certificate_missing: [401, 'invalid_token'],
      certificate_mismatch: [401, 'invalid_token'],
      insufficient_user_authentication: [401, 'insufficient_user_authentication'],
      insufficient_scope: [403, 'insufficient_scope'],
    };
    const actual = Object.fromEntries(
      Object.entries(guardErrorTable).map(([code, row]) => [code, [row.status, row.error]]),
    );
    expect(actual).toEqual(expected);
  });

  it('every code has a fixed, RFC 6750-safe challenge and an RFC 9457 body', () => {
    const safe = /^[\x20\x21\x23-\x5B\x5D-\x7E]*$/;
    for (const code of Object.keys(guardErrorTable) as GuardErrorCode[]) {
      const error = new GuardError(code);
      const row = guardErrorTable[code];
      expect(error.status).toBe(row.status);
      expect(safe.test(row.description)).toBe(true);
      // Proof errors and the nonce request are DPoP's own (RFC 9449 §7.1, §9).
      const scheme = row.error === 'invalid_dpop_proof' || row.error === 'use_dpop_nonce' ? 'DPoP' : 'Bearer';
      expect(error.wwwAuthenticate.startsWith(`${scheme} realm="api"`)).toBe(true);
      if (row.error === undefined) expect(error.wwwAuthenticate).toBe('Bearer realm="api"');
      else expect(error.wwwAuthenticate).toContain(`error="${row.error}", error_description="${row.description}"`);
      expect(error.toProblem()).toEqual({
        type: `https://idem.dev/problems/${code.replaceAll('_', '-')}`,
        title: row.title,
        status: row.status,
        detail: row.description,
        code,
        // The server's own dependencies (key endpoint, DPoP replay memory): the same token may pass later.
        retryable: [
          'keys_unavailable',
          'dpop_replay_full',
          'dpop_replay_share_full',
          'dpop_replay_unavailable',
        ].includes(code),
      });
      expect(isGuardError(error)).toBe(true);
    }
  });

  it('hostile claims, kids and headers never reach the challenge or the problem body', async () => {
    const guard = createGuard({ audience: AUDIENCE, realm: 'orders', issuers: [{ issuer: ISSUER, secret: SECRET }] });
    const hostile = '"\r\nSet-Cookie: x=1\u00e9\\';
    const tokens = [
      makeToken({ claims: { aud: hostile } }),
      makeToken({ header: { kid: hostile } }),
      makeToken({ claims: { iss: hostile } }),
      makeToken({ claims: { exp: hostile } }),
    ];
    for (const token of tokens) {
      const result = await guard.authenticate({ headers: { authorization: `Bearer ${token}` } });
      expect(result.ok).toBe(false);
      if (!result.ok) {
        expect(result.error.wwwAuthenticate).not.toMatch(/Set-Cookie|\r|\n|\u00e9/);
        expect(JSON.stringify(result.error.toProblem())).not.toContain('Set-Cookie');
      }
    }
    expect(() =>
      createGuard({ audience: AUDIENCE, realm: 'a"b', issuers: [{ issuer: ISSUER, secret: SECRET }] }),
    ).toThrow(TypeError);
  });
});

describe('events and counters', () => {
  it('reports each outcome with a per-reason counter; a throwing hook changes nothing', async () => {
    const clock = manualClock();
    const events: GuardEvent[] = [];
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      onEvent: (event) => {
        events.push(event);
        throw new Error('metrics down');
      },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const good = makeToken();
    expect((await guard.verify(good)).ok).toBe(true);
    expect((await guard.verify(good)).ok).toBe(true);
    await guard.verify(makeToken({ claims: { exp: clock.seconds() - 100 } }));
    await guard.verify(makeToken({ claims: { aud: 'other' } }));
    await guard.verify(`${good.slice(0, -3)}AAA`);
    await guard.authenticate({ headers: {} });
    expect(guard.stats()).toMatchObject({
      authenticated: 2,
      cacheHits: 1,
      rejected: { token_expired: 1, audience_invalid: 1, signature_invalid: 1, token_missing: 1 },
    });
    expect(events.map((event) => event.type)).toEqual([
      'authenticated',
      'authenticated',
      'rejected',
      'rejected',
      'rejected',
      'rejected',
    ]);
  });

  it('handles what an async hook rejects with (unhandled, it would end the process)', async () => {
    // Pending, and watched for a handler: a promise that rejected would fail the file instead.
    const returned = new Promise<void>(() => undefined);
    const handlers = vi.spyOn(returned, 'then');
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      onEvent: () => returned,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    expect((await guard.verify(makeToken())).ok).toBe(true);
    expect(handlers).toHaveBeenCalled();
  });

  it('bad options throw a TypeError once, at construction', () => {
    expect(() => createGuard({ issuers: [{ issuer: ISSUER, secret: SECRET }] })).toThrow(/audience/);
    expect(() => createGuard({ audience: AUDIENCE, issuers: [] })).toThrow(TypeError);
    expect(() =>
      createGuard({ audience: AUDIENCE, clockTolerance: 61, issuers: [{ issuer: ISSUER, secret: SECRET }] }),
    ).toThrow(TypeError);
    expect(() => createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER }] })).toThrow(TypeError);
    expect(() =>
      createGuard({
        audience: AUDIENCE,
        issuers: [{ issuer: ISSUER, secret: SECRET, algorithms: ['none' as 'HS256'] }],
      }),
    ).toThrow(TypeError);
  });
});
