import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  type DpopOptions,
  forwardHeaders,
  GuardError,
  type GuardOptions,
} from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './support/tokens.js';

// Small defects a docs audit noticed in @idem/guard and left alone, each checked against the code and
// the RFCs, decided, pinned here. Time is injected; the replay stores are functions (no server needed).

const keys = testKeys();
const ORIGIN = 'https://api.example';
const issuers = [{ issuer: ISSUER, secret: SECRET }];

function dpopGuard(dpop: DpopOptions, options: Partial<GuardOptions> = {}) {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    ...options,
    dpop: { origin: ORIGIN, ...dpop },
    issuers,
  });
  return { clock, guard };
}

function proof(accessToken: string, nowSeconds: number): string {
  const header = { typ: 'dpop+jwt', alg: 'ES256', jwk: keys.ec.publicJwk };
  const claims = {
    jti: randomUUID(),
    htm: 'POST',
    htu: `${ORIGIN}/orders`,
    iat: nowSeconds,
    ath: createHash('sha256').update(accessToken).digest('base64url'),
  };
  return signSegments(b64url(header), b64url(claims), 'ES256', keys.ec.privateKey);
}

async function principal() {
  const guard = createGuard({ audience: AUDIENCE, now: manualClock().now, issuers });
  const result = await guard.verify(makeToken());
  if (!result.ok) throw new Error(result.error.code);
  return result.principal;
}

describe('forwardHeaders and the caller credentials', () => {
  // Was wrong: only `Authorization` was dropped, and the client's `DPoP` proof went on to the
  // upstream. A proof is a signed credential of the caller's key for the gateway's URL: an internal
  // service has no use for it, and one that logs or relays headers leaks it.
  it('drops the DPoP proof with the Authorization header, in any spelling; keepAuthorization keeps both', async () => {
    const issuer = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    const incoming = { authorization: 'DPoP abc', DPoP: 'proof', dpop: 'proof', accept: 'application/json' };
    const headers = await forwardHeaders(incoming, await principal(), { issuer, audience: 'orders' });
    expect(Object.keys(headers).sort()).toEqual(['accept', 'idem-internal-token']);
    // Kept on purpose, the caller's credentials go together: a DPoP-bound token is no use without its proof.
    const kept = await forwardHeaders(incoming, await principal(), {
      issuer,
      audience: 'orders',
      keepAuthorization: true,
    });
    expect(Object.keys(kept).sort()).toEqual(['DPoP', 'accept', 'authorization', 'dpop', 'idem-internal-token']);
  });

  // The guard reads no cookie, so none is its credential to drop: a route behind the gateway may need
  // them (documented, with `extra: ['cookie']` to strip them).
  it('Cookie passes unless the gateway adds it to extra', async () => {
    const issuer = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    const incoming = { cookie: 'session=1', accept: 'application/json' };
    const passed = await forwardHeaders(incoming, await principal(), { issuer, audience: 'orders' });
    expect(passed.cookie).toBe('session=1');
    const stripped = await forwardHeaders(incoming, await principal(), {
      issuer,
      audience: 'orders',
      extra: ['cookie'],
    });
    expect(stripped.cookie).toBeUndefined();
  });
});

describe('DPoP replay options', () => {
  // Was wrong: a `replay` store given with `maxReplayEntries` (which bounds only the in-process
  // memory) silently ignored the limit; and `replayTimeout` without a store, the in-process memory
  // answering at once, was ignored too. A bound the operator believes in and that is not there.
  it('maxReplayEntries with a replay store, or replayTimeout without one, is a TypeError naming both', () => {
    const replay = () => true;
    expect(() => dpopGuard({ replay, maxReplayEntries: 10 })).toThrow(
      /dpop\.maxReplayEntries.*dpop\.replay|dpop\.replay.*dpop\.maxReplayEntries/,
    );
    expect(() => dpopGuard({ replayTimeout: 2 })).toThrow(/dpop\.replayTimeout.*dpop\.replay\b/);
    expect(() => dpopGuard({ replay, replayTimeout: 2 })).not.toThrow();
    // A store that is no function (a client object passed as is) refused every proof as unavailable.
    expect(() => dpopGuard({ replay: {} as never })).toThrow(/dpop\.replay must be a function/);
    expect(() => dpopGuard({ maxReplayEntries: 10 })).not.toThrow();
  });
});

describe('retryable DPoP replay refusals', () => {
  // Was wrong: `retryable` was false for `dpop_replay_full` and `dpop_replay_unavailable`, while
  // docs/errors.md told clients to retry them with a fresh proof. Both say the server's replay memory
  // could not take the proof, not that the token or the proof is bad: the same token passes later.
  for (const [label, replay, code] of [
    ['full', () => 'full' as const, 'dpop_replay_full'],
    [
      'down',
      () => {
        throw new Error('ECONNREFUSED');
      },
      'dpop_replay_unavailable',
    ],
  ] as const) {
    it(`a replay memory that is ${label} refuses with ${code}, retryable: true`, async () => {
      const { clock, guard } = dpopGuard({ replay });
      const accessToken = makeToken({
        claims: { cnf: { jkt: await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256') } },
      });
      const result = await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof(accessToken, clock.seconds()) },
      });
      expect(result.ok || [result.error.code, result.error.retryable, result.error.toProblem().retryable]).toEqual([
        code,
        true,
        true,
      ]);
    });
  }

  it('a replayed proof stays final: the same proof never passes', () => {
    expect(new GuardError('dpop_proof_replayed').retryable).toBe(false);
  });
});

describe('query tokens with DPoP required', () => {
  // Was wrong: with `dpop.required`, a query token is a bearer token and never read, yet
  // `carriesCredentials` counted it, so an `optional` route answered 401 to a request it should have
  // served as anonymous; and the option the operator set did nothing. Decided: the combination is
  // refused at construction, naming both.
  it('allowQueryToken with dpop.required is a TypeError naming both', () => {
    expect(() => dpopGuard({ required: true }, { allowQueryToken: true })).toThrow(
      /allowQueryToken.*dpop\.required|dpop\.required.*allowQueryToken/,
    );
    expect(() => dpopGuard({}, { allowQueryToken: true })).not.toThrow();
    expect(() => dpopGuard({ required: true }, { allowQueryToken: false })).not.toThrow();
  });
});

describe('remote JWKS over http: on loopback', () => {
  const guardFor = (jwksUri: string) => () =>
    createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, jwksUri, algorithms: ['ES256'] }] });

  // Was wrong: only 127.0.0.1 of 127.0.0.0/8 was loopback (RFC 1122 §3.2.1.3, RFC 6890): a JWKS
  // served on 127.0.0.2 (a second local listener, a sidecar bound to its own address) was refused.
  it('takes every address of 127.0.0.0/8 and the IPv4-mapped ones, in any spelling the URL parser reads', () => {
    for (const uri of [
      'http://127.0.0.2:8080/jwks',
      'http://127.255.255.254/jwks',
      'http://127.1:8080/jwks', // read as 127.0.0.1
      'http://2130706434/jwks', // 127.0.0.2 as one number
      'http://[::ffff:127.0.0.2]/jwks',
    ]) {
      expect(guardFor(uri), uri).not.toThrow();
    }
  });

  it('refuses http: on every other host, names that merely start like loopback included', () => {
    for (const uri of [
      'http://128.0.0.1/jwks',
      'http://126.255.255.255/jwks',
      'http://127.0.0.1.nip.io/jwks',
      'http://localhost.example/jwks',
      'http://api.localhost/jwks',
      'http://[::ffff:10.0.0.1]/jwks',
      'http://[::2]/jwks',
    ]) {
      expect(guardFor(uri), uri).toThrow(TypeError);
    }
  });
});
