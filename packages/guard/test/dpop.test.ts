import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it, vi } from 'vitest';
import { createGuard, type DpopOptions, type GuardOptions, type GuardResult, memoryReplayCache } from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './support/tokens.js';

// Research case 52 and section 10 item 9: DPoP (RFC 9449) with a replay memory and dual challenges.

const keys = testKeys();
const ORIGIN = 'https://api.example';

function setup(dpop: DpopOptions = {}, options: Partial<GuardOptions> = {}) {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    ...options,
    dpop: { origin: ORIGIN, ...dpop },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  return { clock, guard };
}

const jkt = (jwk: Record<string, unknown>) => calculateJwkThumbprint(jwk as never, 'sha256');

interface ProofSpec {
  accessToken: string;
  htm?: string;
  htu?: string;
  iat?: number;
  jti?: string;
  header?: Record<string, unknown>;
  claims?: Record<string, unknown>;
  key?: typeof keys.ec;
  alg?: string;
}

function proof(spec: ProofSpec, nowSeconds: number): string {
  const pair = spec.key ?? keys.ec;
  const alg = spec.alg ?? 'ES256';
  const header = { typ: 'dpop+jwt', alg, jwk: pair.publicJwk, ...spec.header };
  const claims = {
    jti: spec.jti ?? randomUUID(),
    htm: spec.htm ?? 'POST',
    htu: spec.htu ?? `${ORIGIN}/orders`,
    iat: spec.iat ?? nowSeconds,
    ath: createHash('sha256').update(spec.accessToken).digest('base64url'),
    ...spec.claims,
  };
  return signSegments(b64url(header), b64url(claims), alg, pair.privateKey);
}

/** A POST /orders with a token bound to the test key and one proof made at `nowSeconds`. */
async function boundRequest(nowSeconds: number) {
  const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
  return {
    method: 'POST',
    url: '/orders',
    headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, nowSeconds) },
  };
}

function code(result: GuardResult): string {
  return result.ok ? 'ok' : result.error.code;
}

describe('DPoP (case 52)', () => {
  // Was a defect: `origin: 'localhost:3000'` parsed as a URL of scheme `localhost:` whose origin is
  // "null", so every proof was refused (invalid htu) with no word at startup; a path
  // (`https://api.example/v1`) was dropped in silence, and `htu` then never carried it.
  it('refuses an origin that is no http(s) origin at construction, and takes one with a trailing slash', () => {
    for (const origin of [
      'localhost:3000',
      'api.example',
      'ftp://api.example',
      'https://api.example/v1',
      'https://user:pw@api.example',
      'https://api.example/?x=1',
      'https://api.example/#top',
    ]) {
      expect(() => setup({ origin }), origin).toThrow(TypeError);
    }
    for (const origin of ['https://api.example', 'https://api.example/', 'http://127.0.0.1:8080']) {
      expect(() => setup({ origin }), origin).not.toThrow();
    }
  });

  // Was a defect: the refusal of an origin with credentials quoted the option whole, the password
  // included, into a message that goes to the startup log.
  it('refuses an origin with credentials without writing them into the message', () => {
    let message = '';
    try {
      setup({ origin: 'https://gateway:s3cret-Pa55@api.example' });
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toMatch(/dpop\.origin/);
    expect(message).not.toContain('s3cret-Pa55');
    expect(message).not.toContain('gateway:');
  });

  // Was a defect: without `origin`, the proof's `htu` was compared with `http://` + Host, and an
  // HTTP/2 request has no Host, only `:authority`: every proof over HTTP/2 was refused.
  it('without origin, an HTTP/2 request is matched by its :authority', async () => {
    const { clock, guard } = setup({ origin: undefined });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const dpopProof = proof({ accessToken, htu: 'http://api.example/orders' }, clock.seconds());
    const result = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof, ':authority': 'api.example' },
    });
    expect(code(result)).toBe('ok');
  });

  it('accepts a bound token with a valid proof, then refuses the same proof again (replay)', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const dpopProof = proof({ accessToken }, clock.seconds());
    const request = {
      method: 'POST',
      url: '/orders?page=2',
      headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof, host: 'internal:8080' },
    };
    const first = await guard.authenticate(request);
    expect(code(first)).toBe('ok');
    const replay = await guard.authenticate(request);
    expect(code(replay)).toBe('dpop_proof_replayed');
    if (!replay.ok) {
      expect(replay.error.status).toBe(401);
      expect(replay.error.wwwAuthenticate).toBe(
        'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof was already used", algs="ES256 EdDSA Ed25519 PS256 RS256"',
      );
    }
    // A fresh proof for the same token passes (the verified-token cache keys on token and key).
    const again = await guard.authenticate({
      ...request,
      headers: { ...request.headers, dpop: proof({ accessToken }, clock.seconds()) },
    });
    expect(code(again)).toBe('ok');
  });

  // docs/guard.md (htm) and GuardRequest.method: without a method the proof is checked as a GET's.
  it('refuses htm, htu, ath, iat, typ, alg, key and signature mismatches', async () => {
    const { clock, guard } = setup({ maxAge: 60 });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const now = clock.seconds();
    const bad: Array<[string, string]> = [
      ['htm', proof({ accessToken, htm: 'GET' }, now)],
      ['htu path', proof({ accessToken, htu: `${ORIGIN}/refunds` }, now)],
      ['htu host', proof({ accessToken, htu: 'https://evil.example/orders' }, now)],
      ['ath', proof({ accessToken: 'another-token' }, now)],
      ['iat too old', proof({ accessToken, iat: now - 120 }, now)],
      ['iat in the future', proof({ accessToken, iat: now + 120 }, now)],
      ['typ', proof({ accessToken, header: { typ: 'jwt' } }, now)],
      ['private key in jwk', proof({ accessToken, header: { jwk: { ...keys.ec.publicJwk, d: 'AAAA' } } }, now)],
      ['foreign signature', proof({ accessToken, header: { jwk: keys.ed.publicJwk } }, now)],
      ['no jwk', proof({ accessToken, header: { jwk: undefined } }, now)],
      ['jti missing', proof({ accessToken, claims: { jti: undefined } }, now)],
    ];
    for (const [label, dpopProof] of bad) {
      const result = await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof },
      });
      expect(code(result), label).toBe('dpop_proof_invalid');
    }
    const hmacProof = signSegments(
      b64url({ typ: 'dpop+jwt', alg: 'HS256', jwk: { kty: 'oct', k: 'x'.repeat(43) } }),
      b64url({ jti: 'j', htm: 'POST', htu: `${ORIGIN}/orders`, iat: now }),
      'HS256',
      'x'.repeat(32),
    );
    const hmac = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: hmacProof },
    });
    expect(code(hmac)).toBe('dpop_proof_invalid');
  });

  it('the proof iat window is maxAge plus the clock tolerance on the old side and the tolerance on the new side, bounds included', async () => {
    const { clock, guard } = setup({ maxAge: 60 });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const now = clock.seconds();
    const attempt = (iat: number) =>
      guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, iat }, now) },
      });
    expect(code(await attempt(now - 65))).toBe('ok');
    expect(code(await attempt(now - 66))).toBe('dpop_proof_invalid');
    expect(code(await attempt(now + 5))).toBe('ok');
    expect(code(await attempt(now + 6))).toBe('dpop_proof_invalid');
  });

  it('a proof is remembered for as long as its iat window lets it pass, clock tolerance included', async () => {
    const { clock, guard } = setup({ maxAge: 60 });
    const request = await boundRequest(clock.seconds());
    expect(code(await guard.authenticate(request))).toBe('ok');
    // Past maxAge but inside the 5 s tolerance the proof still passes its iat check: it must still be a replay.
    clock.advance(65);
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_replayed');
    clock.advance(1);
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_invalid');
  });

  it('a proof jti is at most 256 characters (the replay memory keeps it)', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const attempt = (jti: string) =>
      guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, jti }, clock.seconds()) },
      });
    expect(code(await attempt('j'.repeat(256)))).toBe('ok');
    expect(code(await attempt('k'.repeat(257)))).toBe('dpop_proof_invalid');
    expect(code(await attempt(''))).toBe('dpop_proof_invalid');
  });

  it('htu is compared after RFC 3986 normalisation (RFC 9449 §4.3): percent-encoding case, unreserved characters, dots', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const attempt = (htu: string, url: string) =>
      guard.authenticate({
        method: 'POST',
        url,
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, htu }, clock.seconds()) },
      });
    const same: Array<[string, string]> = [
      [`${ORIGIN}/%7Euser/orders`, '/~user/orders'],
      [`${ORIGIN}/~user/orders`, '/%7euser/orders'],
      [`${ORIGIN}/a%2fb`, '/a%2Fb'],
      [`${ORIGIN}/%6Frders`, '/orders'],
      ['HTTPS://API.EXAMPLE:443/orders', '/orders'],
      [`${ORIGIN}/orders`, '/v1/../orders?page=2'],
    ];
    for (const [htu, url] of same) expect(code(await attempt(htu, url)), `${htu} vs ${url}`).toBe('ok');
    // An encoded slash is not a slash, and other characters keep their case.
    const different: Array<[string, string]> = [
      [`${ORIGIN}/a%2Fb`, '/a/b'],
      [`${ORIGIN}/Orders`, '/orders'],
      [`${ORIGIN}/orders%20`, '/orders'],
    ];
    for (const [htu, url] of different) {
      expect(code(await attempt(htu, url)), `${htu} vs ${url}`).toBe('dpop_proof_invalid');
    }
  });

  it('refuses a missing or doubled proof header, and a token bound to another key', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const base = { method: 'POST', url: '/orders' };
    expect(code(await guard.authenticate({ ...base, headers: { authorization: `DPoP ${accessToken}` } }))).toBe(
      'dpop_proof_invalid',
    );
    const twice = [proof({ accessToken }, clock.seconds()), proof({ accessToken }, clock.seconds())];
    expect(
      code(await guard.authenticate({ ...base, headers: { authorization: `DPoP ${accessToken}`, dpop: twice } })),
    ).toBe('dpop_proof_invalid');
    const otherKeyProof = proof({ accessToken, key: keys.ed, alg: 'EdDSA' }, clock.seconds());
    const mismatch = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${accessToken}`, dpop: otherKeyProof },
    });
    expect(code(mismatch)).toBe('token_binding_invalid');
    if (!mismatch.ok)
      expect(mismatch.error.wwwAuthenticate.startsWith('DPoP realm="api", error="invalid_token"')).toBe(true);
    const unbound = makeToken();
    const unboundResult = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${unbound}`, dpop: proof({ accessToken: unbound }, clock.seconds()) },
    });
    expect(code(unboundResult)).toBe('token_binding_invalid');
    // Still so once the token sits in the verified-token cache as a bearer result.
    expect(code(await guard.verify(unbound))).toBe('ok');
    const cachedUnbound = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${unbound}`, dpop: proof({ accessToken: unbound }, clock.seconds()) },
    });
    expect(code(cachedUnbound)).toBe('token_binding_invalid');
  });

  it('a DPoP-bound token sent as Bearer is refused; plain bearer tokens still work when DPoP is optional', async () => {
    const { guard } = setup();
    const bound = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    expect(
      code(await guard.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${bound}` } })),
    ).toBe('token_bound');
    expect(
      code(await guard.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${makeToken()}` } })),
    ).toBe('ok');
    const missing = await guard.authenticate({ method: 'GET', url: '/', headers: {} });
    expect(!missing.ok && missing.error.wwwAuthenticate).toBe(
      'Bearer realm="api", DPoP realm="api", algs="ES256 EdDSA Ed25519 PS256 RS256"',
    );
  });

  it('required mode refuses Bearer and challenges with DPoP only', async () => {
    const { guard } = setup({ required: true, algorithms: ['ES256'] });
    const result = await guard.authenticate({
      method: 'GET',
      url: '/',
      headers: { authorization: `Bearer ${makeToken()}` },
    });
    expect(code(result)).toBe('token_missing');
    if (!result.ok) expect(result.error.wwwAuthenticate).toBe('DPoP realm="api", algs="ES256"');
    // A query token is a bearer token too: with DPoP required it is no credential, not even read.
    // (`allowQueryToken` with `dpop.required` is a TypeError: guard-notes.audit.test.ts.)
    expect(
      code(await guard.authenticate({ method: 'GET', headers: {}, url: `/orders?access_token=${makeToken()}` })),
    ).toBe('token_missing');
  });

  it('refuses a proof whose alg is not on dpop.algorithms, or whose header carries crit, b64 or a key reference', async () => {
    const { clock, guard } = setup({ algorithms: ['ES256'] });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ed.publicJwk) } } });
    const attempt = (dpopProof: string) =>
      guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof },
      });
    // A valid EdDSA proof for a token bound to that key: refused only because EdDSA is not allowed here.
    expect(code(await attempt(proof({ accessToken, key: keys.ed, alg: 'EdDSA' }, clock.seconds())))).toBe(
      'dpop_proof_invalid',
    );
    const ecToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const headers: Array<Record<string, unknown>> = [
      { crit: ['x-ext'], 'x-ext': 1 },
      { b64: true },
      { jku: 'https://evil.example/jwks' },
      { x5u: 'https://evil.example/cert' },
      { x5c: ['MIIBfake'] },
      { zip: 'DEF' },
      { enc: 'A128GCM' },
    ];
    for (const header of headers) {
      const result = await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${ecToken}`, dpop: proof({ accessToken: ecToken, header }, clock.seconds()) },
      });
      expect(code(result), JSON.stringify(header)).toBe('dpop_proof_invalid');
    }
    const clean = proof({ accessToken: ecToken }, clock.seconds());
    expect(
      code(
        await guard.authenticate({
          method: 'POST',
          url: '/orders',
          headers: { authorization: `DPoP ${ecToken}`, dpop: clean },
        }),
      ),
    ).toBe('ok');
  });

  it('uses a shared replay store when given one', async () => {
    const seen = new Set<string>();
    const keysSeen: string[] = [];
    const { clock, guard } = setup({
      replay: (key) => {
        keysSeen.push(key);
        if (seen.has(key)) return false;
        seen.add(key);
        return true;
      },
    });
    const thumbprint = await jkt(keys.ec.publicJwk);
    const accessToken = makeToken({ claims: { cnf: { jkt: thumbprint } } });
    const dpopProof = proof({ accessToken, jti: 'proof-1' }, clock.seconds());
    const request = {
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof },
    };
    expect(code(await guard.authenticate(request))).toBe('ok');
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_replayed');
    expect(keysSeen).toEqual([`${thumbprint}:proof-1`, `${thumbprint}:proof-1`]);
  });

  it('a DPoP-bound cache entry is never reached without a proof: "<token> <jkt>" as a query token or through verify()', async () => {
    const { clock, guard } = setup({}, { allowQueryToken: true });
    const thumbprint = await jkt(keys.ec.publicJwk);
    const bound = makeToken({ claims: { cnf: { jkt: thumbprint } } });
    const legit = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${bound}`, dpop: proof({ accessToken: bound }, clock.seconds()) },
    });
    expect(code(legit)).toBe('ok');
    // The thumbprint is public (it is the token's own cnf.jkt); no proof, no key.
    const viaQuery = await guard.authenticate({
      method: 'POST',
      url: `/orders?access_token=${bound}%20${thumbprint}`,
      headers: {},
    });
    expect(code(viaQuery)).toBe('token_malformed');
    expect(code(await guard.verify(`${bound} ${thumbprint}`))).toBe('token_malformed');
    // Nor by gluing the thumbprint and the token into one bearer string (both are in the compact alphabet).
    expect(code(await guard.verify(`${thumbprint}${bound}`))).not.toBe('ok');
    expect(
      code(
        await guard.authenticate({
          method: 'GET',
          url: '/',
          headers: { authorization: `Bearer ${thumbprint}${bound}` },
        }),
      ),
    ).not.toBe('ok');
    expect(code(await guard.verify(`${thumbprint}:${bound}`))).not.toBe('ok');
    expect(
      code(await guard.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${bound}` } })),
    ).toBe('token_bound');
    expect(guard.stats().cacheHits).toBe(0);
  });

  it('proofs sent with an invalid access token are not remembered, so they cannot push real proof ids out', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 5 }, { cache: false });
    const victimToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const captured = {
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${victimToken}`, dpop: proof({ accessToken: victimToken }, clock.seconds()) },
    };
    expect(code(await guard.authenticate(captured))).toBe('ok');
    // An unauthenticated flood: junk access tokens, valid proofs signed with the attacker's own key.
    const junk = 'eyJhbGciOiJIUzI1NiJ9.e30.AAAA';
    for (let i = 0; i < 10; i++) {
      const flood = await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: {
          authorization: `DPoP ${junk}`,
          dpop: proof({ accessToken: junk, key: keys.ed, alg: 'EdDSA' }, clock.seconds()),
        },
      });
      expect(flood.ok).toBe(false);
    }
    clock.advance(10); // still inside the captured proof's 60 s window
    expect(code(await guard.authenticate(captured))).toBe('dpop_proof_replayed');
  });

  it('the replay memory is consulted only after the access token and its binding verify', async () => {
    const keysSeen: string[] = [];
    const { clock, guard } = setup({
      replay: (key) => {
        keysSeen.push(key);
        return true;
      },
    });
    const thumbprint = await jkt(keys.ec.publicJwk);
    const send = async (accessToken: string) =>
      code(
        await guard.authenticate({
          method: 'POST',
          url: '/orders',
          headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, clock.seconds()) },
        }),
      );
    expect(await send(makeToken({ claims: { cnf: { jkt: thumbprint }, exp: clock.seconds() - 60 } }))).toBe(
      'token_expired',
    );
    expect(await send(makeToken({ claims: { cnf: { jkt: 'another-key' } } }))).toBe('token_binding_invalid');
    expect(await send(makeToken({ claims: { cnf: { jkt: thumbprint }, aud: 'https://other.example' } }))).toBe(
      'audience_invalid',
    );
    expect(keysSeen).toEqual([]);
    expect(await send(makeToken({ claims: { cnf: { jkt: thumbprint } } }))).toBe('ok');
    expect(keysSeen).toHaveLength(1);
  });

  it('a full replay memory refuses new proofs (dpop_replay_full) instead of forgetting a live one', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 2, maxReplayEntriesPerKey: 2 });
    const accessToken = makeToken({
      claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) }, exp: clock.seconds() + 3600 },
    });
    const request = () => ({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, clock.seconds()) },
    });
    const first = request();
    expect(code(await guard.authenticate(first))).toBe('ok');
    expect(code(await guard.authenticate(request()))).toBe('ok');
    const full = await guard.authenticate(request());
    expect(code(full)).toBe('dpop_replay_full');
    if (!full.ok) {
      expect(full.error.status).toBe(401);
      expect(full.error.wwwAuthenticate).toBe(
        'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof cannot be accepted now: the replay memory is full", algs="ES256 EdDSA Ed25519 PS256 RS256"',
      );
    }
    // The oldest live proof id was kept: its replay is still caught.
    expect(code(await guard.authenticate(first))).toBe('dpop_proof_replayed');
    // Once the remembered proofs are past their window (60 s + twice the 5 s tolerance), room is back.
    clock.advance(71);
    expect(code(await guard.authenticate(request()))).toBe('ok');
    expect(guard.stats().rejected.dpop_replay_full).toBe(1);
  });

  for (const [label, failing] of [
    [
      'throws',
      () => {
        throw new Error('ECONNREFUSED');
      },
    ],
    ['rejects', () => Promise.reject(new Error('ECONNREFUSED'))],
    // A store client that brings its own promise type: any thenable is awaited, not only a Promise.
    [
      'answers with a thenable that rejects',
      () =>
        ({
          // biome-ignore lint/suspicious/noThenProperty: the point is a non-native thenable
          then: (_resolve: unknown, reject: (error: Error) => void) => reject(new Error('ECONNREFUSED')),
        }) as unknown as Promise<boolean>,
    ],
  ] as const) {
    it(`a replay store that ${label} refuses the proof (dpop_replay_unavailable), never accepts it nor throws`, async () => {
      const events: string[] = [];
      let down = true;
      const seen = new Set<string>();
      const { clock, guard } = setup(
        {
          replay: (key) => {
            if (down) return failing();
            if (seen.has(key)) return false;
            seen.add(key);
            return true;
          },
        },
        { onEvent: (event) => events.push(event.type === 'rejected' ? `rejected:${event.code}` : event.type) },
      );
      const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
      const request = {
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, clock.seconds()) },
      };
      const refused = await guard.authenticate(request);
      expect(code(refused)).toBe('dpop_replay_unavailable');
      if (!refused.ok) {
        expect(refused.error.status).toBe(401);
        expect(refused.error.wwwAuthenticate).toBe(
          'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof cannot be accepted now: the replay memory is unavailable", algs="ES256 EdDSA Ed25519 PS256 RS256"',
        );
      }
      expect(events).toEqual(['rejected:dpop_replay_unavailable']);
      expect(guard.stats().rejected.dpop_replay_unavailable).toBe(1);
      // The token itself was fine and is cached; the cache must not let it through without the store either.
      expect(code(await guard.authenticate(request))).toBe('dpop_replay_unavailable');
      expect(guard.stats().authenticated).toBe(0);
      // The store is back: the same proof, never remembered, passes once.
      down = false;
      expect(code(await guard.authenticate(request))).toBe('ok');
      expect(code(await guard.authenticate(request))).toBe('dpop_proof_replayed');
    });
  }

  it('a replay store that hangs refuses the proof after replayTimeout (dpop_replay_unavailable), never hangs the request', async () => {
    let reached!: () => void;
    const storeReached = new Promise<void>((resolve) => {
      reached = resolve;
    });
    const hangs = () => {
      reached();
      return new Promise<boolean>(() => undefined);
    };
    const { clock, guard } = setup({ replay: hangs, replayTimeout: 2 });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    // Only the timeout's timer is faked: verification itself runs on real crypto.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    let settled: GuardResult | undefined;
    void guard
      .authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, clock.seconds()) },
      })
      .then((result) => {
        settled = result;
      });
    // Verification reaches the store however long its crypto takes on a busy machine; from then on
    // only the timeout's timer is left, and the time passes short of it, then past it.
    await storeReached;
    await vi.advanceTimersByTimeAsync(1_900);
    expect(settled).toBeUndefined();
    await vi.advanceTimersByTimeAsync(200);
    vi.useRealTimers();
    const refused = settled as GuardResult;
    expect(code(refused)).toBe('dpop_replay_unavailable');
    expect(guard.stats().rejected.dpop_replay_unavailable).toBe(1);
  });

  it('memoryReplayCache: a seen key is refused until it expires; full means full of live keys', () => {
    let now = 0;
    const seen = memoryReplayCache(2, () => now);
    expect(seen('a', 100)).toBe(true);
    expect(seen('a', 100)).toBe(false);
    // Expiries need not arrive in order: b, stored after a, is forgotten first.
    expect(seen('b', 50)).toBe(true);
    expect(seen('c', 200)).toBe('full');
    now = 50;
    expect(seen('c', 200)).toBe(true);
    expect(seen('a', 100)).toBe(false);
    expect(seen('b', 120)).toBe('full');
    now = 100;
    expect(seen('a', 300)).toBe(true);
    expect(seen('c', 200)).toBe(false);
  });

  it('memoryReplayCache forgets every expired key whatever order expiries arrive in, and no live one', () => {
    // A deterministic shuffle of expiries: the memory must forget exactly the expired keys.
    let seed = 7;
    const next = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed;
    };
    let now = 0;
    const capacity = 64;
    const seen = memoryReplayCache(capacity, () => now);
    const expiries = new Map<string, number>();
    for (let i = 0; i < capacity; i++) {
      const key = `k${i}`;
      expiries.set(key, 1 + (next() % 1000));
      expect(seen(key, expiries.get(key) as number)).toBe(true);
    }
    for (now = 0; now <= 1000; now += 50) {
      // Every live key is still refused; room is exactly what the expired ones left.
      const live = [...expiries].filter(([, expiresAt]) => expiresAt > now);
      for (const [key] of live) expect(seen(key, 2000), `${key} at ${now}`).toBe(false);
      let added = 0;
      while (seen(`new-${now}-${added}`, now + 1) === true) added++;
      expect(added, `room at ${now}`).toBe(capacity - live.length);
      for (let i = 0; i < added; i++) expiries.set(`new-${now}-${i}`, now + 1);
    }
  });

  it('a cached bound token is never served to a proof of another key (a stolen token with its own proof)', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const base = { method: 'POST', url: '/orders' };
    const owner = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken }, clock.seconds()) },
    });
    expect(code(owner)).toBe('ok');
    const thief = await guard.authenticate({
      ...base,
      headers: {
        authorization: `DPoP ${accessToken}`,
        dpop: proof({ accessToken, key: keys.ed, alg: 'EdDSA' }, clock.seconds()),
      },
    });
    expect(code(thief)).toBe('token_binding_invalid');
  });

  it('refuses bad DPoP options at construction', () => {
    expect(() => setup({ algorithms: ['HS256'] })).toThrow(TypeError);
    expect(() => setup({ maxAge: 0 })).toThrow(TypeError);
    for (const maxReplayEntries of [0, -1, 1.5, Number.POSITIVE_INFINITY]) {
      expect(() => setup({ maxReplayEntries })).toThrow(TypeError);
    }
    for (const replayTimeout of [0, 0.001, 61, Number.NaN]) {
      expect(() => setup({ replay: () => true, replayTimeout })).toThrow(/replayTimeout must/);
    }
  });
});

describe('DPoP server nonces (RFC 9449 §9)', () => {
  const secret = 'a shared secret of thirty-two bytes!';

  async function nonceSetup(nonce: DpopOptions['nonce'] = { secret, lifetime: 300 }) {
    const { clock, guard } = setup({ nonce });
    // Good for an hour: the test moves the clock across nonce windows.
    const accessToken = makeToken({
      now: clock.now(),
      claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) }, exp: clock.seconds() + 3600 },
    });
    const send = (claims: Record<string, unknown> = {}) =>
      guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, claims }, clock.seconds()) },
      });
    return { clock, guard, send };
  }

  it('refuses a proof without the nonce with use_dpop_nonce and hands the current one; the retry with it passes', async () => {
    const { send } = await nonceSetup();
    const first = await send();
    expect(code(first)).toBe('dpop_nonce_required');
    if (first.ok) throw new Error('expected a refusal');
    expect(first.error.status).toBe(401);
    expect(first.error.wwwAuthenticate).toBe(
      'DPoP realm="api", error="use_dpop_nonce", error_description="The DPoP proof must carry the nonce this server provides", algs="ES256 EdDSA Ed25519 PS256 RS256"',
    );
    const nonce = first.error.dpopNonce;
    expect(nonce).toMatch(/^[0-9a-z]+\.[A-Za-z0-9_-]{43}$/);
    const retried = await send({ nonce });
    expect(code(retried)).toBe('ok');
    // Fresh: no new nonce needed with the answer.
    expect(retried.ok && retried.dpopNonce).toBeUndefined();
  });

  it('takes a nonce of the last window and hands the current one with the answer; one older is refused again', async () => {
    const { clock, send } = await nonceSetup();
    const refused = await send();
    const nonce = refused.ok ? undefined : refused.error.dpopNonce;
    clock.advance(300);
    const late = await send({ nonce });
    expect(code(late)).toBe('ok');
    const next = late.ok ? late.dpopNonce : undefined;
    expect(next).toBeDefined();
    expect(next).not.toBe(nonce);
    clock.advance(300);
    const stale = await send({ nonce });
    expect(code(stale)).toBe('dpop_nonce_required');
    expect(code(await send({ nonce: next }))).toBe('ok');
  });

  it("refuses forged, foreign and malformed nonces; gateways that share the secret take each other's", async () => {
    const { send } = await nonceSetup();
    const refused = await send();
    const nonce = refused.ok ? '' : (refused.error.dpopNonce as string);
    const [window, mac] = nonce.split('.') as [string, string];
    const other = await nonceSetup({ secret: 'another secret, also thirty-two bytes' });
    const foreign = await other.send();
    const foreignNonce = foreign.ok ? '' : (foreign.error.dpopNonce as string);
    for (const bad of [
      foreignNonce,
      `${window}.${mac.slice(0, -1)}A`,
      `0${window}.${mac}`,
      `${(Number.parseInt(window, 36) + 1).toString(36)}.${mac}`,
      `${window}.${mac}=`,
      `.${mac}`,
      '',
      42,
      'x'.repeat(5000),
    ]) {
      expect(code(await send({ nonce: bad })), String(bad).slice(0, 40)).toBe('dpop_nonce_required');
    }
    const twin = await nonceSetup({ secret, lifetime: 300 });
    expect(code(await twin.send({ nonce }))).toBe('ok');
  });

  it('a proof that fails on its own is refused for that, before any nonce is handed out', async () => {
    const { clock, guard } = await nonceSetup();
    const accessToken = makeToken({ now: clock.now(), claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const wrongMethod = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, htm: 'GET' }, clock.seconds()) },
    });
    expect(code(wrongMethod)).toBe('dpop_proof_invalid');
    expect(wrongMethod.ok ? 'ok' : wrongMethod.error.dpopNonce).toBeUndefined();
  });

  it('checks its options: true makes a random secret; a short secret or a lifetime out of range is a TypeError', async () => {
    const { send } = await nonceSetup(true);
    const refused = await send();
    expect(refused.ok ? undefined : refused.error.dpopNonce).toBeDefined();
    for (const bad of [{ secret: 'short' }, { lifetime: 5 }, { lifetime: 100_000 }, { secret: 42 }, 'yes']) {
      expect(() => setup({ nonce: bad as never }), JSON.stringify(bad)).toThrow(TypeError);
    }
    expect(() => setup({ nonce: { secret: new Uint8Array(32) } })).not.toThrow();
  });
});

describe('DPoP and the request method', () => {
  // Was a defect: without `method`, a proof was checked as a GET's. A POST with its own proof (htm
  // POST) was refused, and a proof made for a GET was taken on a POST: `htm` bound nothing.
  it('authenticate without a method is a TypeError naming it when the guard has DPoP, bearer or not', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const getProof = proof({ accessToken, htm: 'GET' }, clock.seconds());
    const dpopHeaders = { authorization: `DPoP ${accessToken}`, dpop: getProof };
    await expect(guard.authenticate({ url: '/orders', headers: dpopHeaders })).rejects.toThrow(TypeError);
    await expect(guard.authenticate({ url: '/orders', headers: dpopHeaders })).rejects.toThrow(/method/);
    await expect(
      guard.authenticate({ url: '/orders', headers: { authorization: `Bearer ${makeToken()}` } }),
    ).rejects.toThrow(/method/);
    await expect(guard.authenticate({ url: '/orders', method: '', headers: dpopHeaders })).rejects.toThrow(/method/);
    // With it, htm binds: the GET proof is refused on a POST, the POST proof taken.
    expect(code(await guard.authenticate({ url: '/orders', method: 'POST', headers: dpopHeaders }))).toBe(
      'dpop_proof_invalid',
    );
    const postProof = proof({ accessToken, htm: 'POST' }, clock.seconds());
    const post = { url: '/orders', method: 'POST', headers: { authorization: `DPoP ${accessToken}`, dpop: postProof } };
    expect(code(await guard.authenticate(post))).toBe('ok');
    // A guard without DPoP needs no method; no request at all still reads as one without a token.
    const plain = createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    expect(
      code(await plain.authenticate({ method: 'GET', url: '/', headers: { authorization: `Bearer ${makeToken()}` } })),
    ).toBe('ok');
    expect(code(await guard.authenticate(undefined as never))).toBe('token_missing');
  });
});

describe('DPoP replay memory and the proof window', () => {
  // Was a defect: a proof passes its iat check up to and including iat + maxAge + tolerance, and the
  // memory forgot it at iat + maxAge + 2 × tolerance. With clockTolerance 0 both are the same instant,
  // and the memory drops what is due at that instant: the proof passed a second time, then.
  it('with clockTolerance 0, a proof replayed at the last instant of its window is refused', async () => {
    const { clock, guard } = setup({ maxAge: 60 }, { clockTolerance: 0 });
    const request = await boundRequest(clock.seconds());
    expect(code(await guard.authenticate(request))).toBe('ok');
    clock.advance(60);
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_replayed');
    clock.advance(0.001);
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_invalid');
  });

  // Was a defect: the iat window was checked when the request came in, the proof remembered once the
  // token had verified, which can take a JWKS fetch (up to its timeout). Two requests with one proof,
  // both checked in the window, both remembered after it: the first was stored already expired, the
  // second cleared it out and was stored in its place, and both passed.
  it('two requests with one proof are not both accepted when the window ends while their tokens verify', async () => {
    const { clock, guard } = setup({ maxAge: 60 }, { cache: false });
    const request = await boundRequest(clock.seconds());
    // Both proofs are checked now (authenticate reads the clock before its first await); the token
    // checks and the memory run after the window (60 s + 5 s tolerance) and the memory's slack (5 s).
    const first = guard.authenticate(request);
    const second = guard.authenticate(request);
    clock.advance(71);
    const codes = [code(await first), code(await second)];
    expect(codes).not.toEqual(['ok', 'ok']);
    // Neither is taken: a proof past its window when it would be remembered is refused as expired.
    expect(codes).toEqual(['dpop_proof_invalid', 'dpop_proof_invalid']);
  });

  it('a proof still inside its window when the token has verified is taken once', async () => {
    const { clock, guard } = setup({ maxAge: 60 }, { cache: false });
    const request = await boundRequest(clock.seconds());
    const first = guard.authenticate(request);
    const second = guard.authenticate(request);
    clock.advance(65);
    expect([code(await first), code(await second)].sort()).toEqual(['dpop_proof_replayed', 'ok']);
  });
});

describe('DPoP and the request URL', () => {
  // Was a defect: without `url`, the proof's htu was compared with the origin plus `/`, so a proof made
  // for the root was taken on a request to any path of a caller who forgot the URL: `htu` bound nothing.
  it('authenticate without a url is a TypeError naming it when the guard has DPoP', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const rootProof = proof({ accessToken, htu: `${ORIGIN}/` }, clock.seconds());
    const headers = { authorization: `DPoP ${accessToken}`, dpop: rootProof };
    await expect(guard.authenticate({ method: 'POST', headers })).rejects.toThrow(TypeError);
    await expect(guard.authenticate({ method: 'POST', headers })).rejects.toThrow(/url/);
    await expect(guard.authenticate({ method: 'POST', url: '', headers })).rejects.toThrow(/url/);
    expect(code(await guard.authenticate({ method: 'POST', url: '/orders', headers }))).toBe('dpop_proof_invalid');
    expect(code(await guard.authenticate({ method: 'POST', url: '/', headers }))).toBe('ok');
  });
});

describe('DPoP and an absolute-form request target', () => {
  // Was wrong: a request sent in absolute form (`POST https://api.example/orders HTTP/1.1`, as a
  // forward proxy sends it; RFC 9112 §3.2.2 says a server must take it) had the configured origin put
  // in front of the whole target, so its own valid proof was refused.
  it('with origin configured, the path and query of an absolute target are matched against the origin', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const request = (url: string, htu: string) => ({
      method: 'POST',
      url,
      headers: { authorization: `DPoP ${accessToken}`, dpop: proof({ accessToken, htu }, clock.seconds()) },
    });
    expect(code(await guard.authenticate(request(`${ORIGIN}/orders?page=2`, `${ORIGIN}/orders?page=2`)))).toBe('ok');
    // The configured origin binds the proof, whatever authority the target names.
    expect(code(await guard.authenticate(request('http://api.example:80/orders', `${ORIGIN}/orders`)))).toBe('ok');
    expect(code(await guard.authenticate(request(`${ORIGIN}/orders`, `${ORIGIN}/other`)))).toBe('dpop_proof_invalid');
    expect(code(await guard.authenticate(request(`${ORIGIN}/orders`, 'https://other.example/orders')))).toBe(
      'dpop_proof_invalid',
    );
  });

  it('without origin, the absolute target is the URL (its authority, not Host, names the server)', async () => {
    const { clock, guard } = setup({ origin: undefined });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const request = (htu: string) => ({
      method: 'POST',
      url: 'http://api.example/orders',
      headers: {
        authorization: `DPoP ${accessToken}`,
        dpop: proof({ accessToken, htu }, clock.seconds()),
        host: 'ignored.example',
      },
    });
    expect(code(await guard.authenticate(request('http://api.example/orders')))).toBe('ok');
    expect(code(await guard.authenticate(request('http://ignored.example/orders')))).toBe('dpop_proof_invalid');
  });
});
