import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createGuard, type GuardEvent, type GuardOptions, type Principal } from '../src/index.js';
import { checkJwk, importKeySet } from '../src/key-import.js';
import { createTokenCache } from '../src/token-cache.js';
import { type JwksReply, startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, START_MS, testKeys } from './support/tokens.js';

// Research cases 16 (kid flood), 50 (outage), 51 (bad JWKS responses), plus rotation, cache headers
// and the verified-token cache interplay. A real HTTP server on an ephemeral port; time is injected.

const keys = testKeys();
const otherEc = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' });
const jwk = (kid: string, pair = keys.ec) => ({ ...pair.publicJwk, kid, alg: 'ES256', use: 'sig' });
const set = (...entries: object[]): JwksReply => ({
  kind: 'json',
  body: { keys: entries },
  headers: { 'cache-control': 'max-age=60' },
});

// The set of k1 alone, served with these headers.
const k1With = (headers: Record<string, string>): Extract<JwksReply, { kind: 'json' }> => ({
  kind: 'json',
  body: { keys: [jwk('k1')] },
  headers,
});

// A token under k1 that outlives every key-set lifetime these tests walk through (2 h).
const longLivedToken = () =>
  makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, claims: { exp: START_MS / 1000 + 7200 } });

let servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(servers.map((server) => server.close()));
  servers = [];
});

async function setup(
  reply: JwksReply,
  jwksOptions: NonNullable<GuardOptions['issuers'][number]['jwksOptions']> = {},
  cache = false,
) {
  const server = await startJwksServer(reply);
  servers.push(server);
  const clock = manualClock();
  const events: GuardEvent[] = [];
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: cache ? { maxEntries: 100 } : false,
    onEvent: (event) => events.push(event),
    issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'], jwksOptions }],
  });
  const token = (kid: string, pair = keys.ec) =>
    makeToken({ alg: 'ES256', key: pair.privateKey, header: { kid }, now: clock.now() });
  return { server, clock, guard, events, token };
}

describe('remote JWKS', () => {
  it('fetches once and honours Cache-Control max-age', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')));
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(50);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    expect(server.requests).toBe(1);
    clock.advance(11);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    expect(server.requests).toBe(2);
  });

  it('refreshes ahead in the background during the last tenth of the lifetime', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')));
    await guard.verify(token('k1'));
    clock.advance(53);
    await guard.verify(token('k1'));
    expect(server.requests).toBe(1);
    server.set(set(jwk('k1'), jwk('k2')));
    clock.advance(2); // 55 s of 60: inside the last tenth
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    // The request did not wait; the background fetch lands on its own.
    await vi.waitFor(() => expect(server.requests).toBe(2));
    // The new set is in place before the old one expired: k2 verifies without another fetch.
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    expect(server.requests).toBe(2);
  });

  it('uses a longer max-age than the default TTL, and clamps no-store to the minimum TTL', async () => {
    const long = await setup({
      kind: 'json',
      body: { keys: [jwk('k1')] },
      headers: { 'cache-control': 'public, max-age=3600' },
    });
    await long.guard.verify(long.token('k1'));
    long.clock.advance(601);
    expect((await long.guard.verify(long.token('k1'))).ok).toBe(true);
    expect(long.server.requests).toBe(1);

    const noStore = await setup({
      kind: 'json',
      body: { keys: [jwk('k1')] },
      headers: { 'cache-control': 'no-store' },
    });
    await noStore.guard.verify(noStore.token('k1'));
    // 26 s: before the last tenth of the 30 s lifetime, where a background refresh would start.
    noStore.clock.advance(26);
    await noStore.guard.verify(noStore.token('k1'));
    expect(noStore.server.requests).toBe(1);
    noStore.clock.advance(5);
    await noStore.guard.verify(noStore.token('k1'));
    expect(noStore.server.requests).toBe(2);
  });

  it('takes an invalid max-age as stale (RFC 9111 4.2.1): the minimum TTL, not the 600 s default', async () => {
    for (const value of ['max-age=-1', 'max-age=soon', 'max-age=']) {
      const invalid = await setup({ kind: 'json', body: { keys: [jwk('k1')] }, headers: { 'cache-control': value } });
      await invalid.guard.verify(invalid.token('k1'));
      invalid.clock.advance(31);
      await invalid.guard.verify(invalid.token('k1'));
      expect(invalid.server.requests, value).toBe(2);
    }
    const quoted = await setup({
      kind: 'json',
      body: { keys: [jwk('k1')] },
      headers: { 'cache-control': 'max-age="120"' },
    });
    await quoted.guard.verify(quoted.token('k1'));
    quoted.clock.advance(100);
    await quoted.guard.verify(quoted.token('k1'));
    expect(quoted.server.requests).toBe(1);
  });

  it('counts the Age a cache on the way gave the set against its max-age (RFC 9111)', async () => {
    // Kept 3600 - 3300 = 300 s here: a CDN already held it for 3300 of them.
    const { server, clock, guard, token } = await setup(
      k1With({ 'cache-control': 'public, max-age=3600', age: '3300' }),
    );
    await guard.verify(token('k1'));
    clock.advance(260); // before the last tenth of 300 s
    await guard.verify(token('k1'));
    expect(server.requests).toBe(1);
    clock.advance(41);
    await guard.verify(token('k1'));
    expect(server.requests).toBe(2);
  });

  it('bounds an aged-out set by minTtl, and ignores an Age that is not a number', async () => {
    const stale = await setup(k1With({ 'cache-control': 'max-age=600', age: '900' }));
    await stale.guard.verify(stale.token('k1'));
    stale.clock.advance(26);
    await stale.guard.verify(stale.token('k1'));
    expect(stale.server.requests).toBe(1);
    stale.clock.advance(5); // past minTtl's 30 s
    await stale.guard.verify(stale.token('k1'));
    expect(stale.server.requests).toBe(2);

    const garbled = await setup(k1With({ 'cache-control': 'max-age=60', age: '-5, 10' }));
    await garbled.guard.verify(garbled.token('k1'));
    garbled.clock.advance(50);
    await garbled.guard.verify(garbled.token('k1'));
    expect(garbled.server.requests).toBe(1);
  });

  it('counts Age against Expires minus Date, and not against an Expires measured from now', async () => {
    const dated = await setup(
      k1With({
        date: new Date(START_MS).toUTCString(),
        expires: new Date(START_MS + 3_600_000).toUTCString(),
        age: '3300',
      }),
    );
    await dated.guard.verify(dated.token('k1'));
    dated.clock.advance(301);
    await dated.guard.verify(dated.token('k1'));
    expect(dated.server.requests).toBe(2);

    const undated = await setup({
      ...k1With({ expires: new Date(START_MS + 300_000).toUTCString(), age: '200' }),
      sendDate: false,
    });
    await undated.guard.verify(undated.token('k1'));
    undated.clock.advance(260);
    await undated.guard.verify(undated.token('k1'));
    expect(undated.server.requests).toBe(1);
  });

  it('rotation: a key published after the cooldown is picked up on its first token', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')));
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(31);
    server.set(set(jwk('k1'), jwk('k2')));
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    expect(server.requests).toBe(2);
    // A key retired from the set stops verifying once the set is refetched.
    clock.advance(61);
    server.set(set(jwk('k2')));
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    const retired = await guard.verify(token('k1'));
    expect(retired.ok ? 'ok' : retired.error.code).toBe('key_unknown');
    expect(server.requests).toBe(3);
  });

  it('case 16: 10,000 random kids cost at most one fetch per cooldown, all refused', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')));
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(31);
    const payload = token('k1').split('.')[1];
    const flood = (count: number) =>
      Array.from(
        { length: count },
        () => `${b64url({ alg: 'ES256', typ: 'at+jwt', kid: randomBytes(12).toString('hex') })}.${payload}.c2ln`,
      );
    const started = performance.now();
    const results = await Promise.all(flood(10_000).map((forged) => guard.verify(forged)));
    const elapsed = performance.now() - started;
    expect(results.every((result) => !result.ok && result.error.code === 'key_unknown')).toBe(true);
    expect(server.requests).toBe(2);
    // Sequential arrivals inside the cooldown: no fetch at all.
    for (const forged of flood(1000)) await guard.verify(forged);
    expect(server.requests).toBe(2);
    clock.advance(31);
    await Promise.all(flood(1000).map((forged) => guard.verify(forged)));
    expect(server.requests).toBe(3);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    expect(guard.stats().rejected.key_unknown).toBe(12_000);
    console.info(`kid flood: 10,000 random kids verified in ${Math.round(elapsed)} ms`);
  });

  it('remembers unknown kids for negativeTtl even after the cooldown', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')), { cooldown: 30, negativeTtl: 120 });
    await guard.verify(token('k1'));
    clock.advance(31);
    await guard.verify(token('ghost'));
    expect(server.requests).toBe(2);
    clock.advance(31);
    expect((await guard.verify(token('ghost'))).ok).toBe(false);
    expect(server.requests).toBe(2);
    await guard.verify(token('other'));
    expect(server.requests).toBe(3);
  });

  it('the cooldown and negativeTtl end exactly when they say: a fetch at cooldown, another at negativeTtl', async () => {
    const { server, clock, guard, token } = await setup(k1With({ 'cache-control': 'max-age=3600' }), {
      cooldown: 30,
      negativeTtl: 120,
    });
    expect((await guard.verify(token('k1'))).ok).toBe(true); // fetch at t=0
    clock.advance(30); // t=30: the cooldown is over
    expect((await guard.verify(token('ghost'))).ok).toBe(false);
    expect(server.requests).toBe(2); // ghost remembered until t=150
    clock.advance(119); // t=149
    expect((await guard.verify(token('ghost'))).ok).toBe(false);
    expect(server.requests).toBe(2);
    clock.advance(1); // t=150: forgotten, and the cooldown allows a fetch
    expect((await guard.verify(token('ghost'))).ok).toBe(false);
    expect(server.requests).toBe(3);
  });

  it('a failed fetch remembers no kid, even while the set it keeps is fresh', async () => {
    const { server, clock, guard, token } = await setup(k1With({ 'cache-control': 'max-age=3600' }), {
      cooldown: 30,
      negativeTtl: 120,
    });
    expect((await guard.verify(token('k1'))).ok).toBe(true); // fetch at t=0
    server.set({ kind: 'raw', status: 503, body: 'down' });
    clock.advance(31);
    expect((await guard.verify(token('k2'))).ok).toBe(false);
    expect(server.requests).toBe(2);
    server.set({ kind: 'json', body: { keys: [jwk('k1'), jwk('k2')] }, headers: { 'cache-control': 'max-age=3600' } });
    clock.advance(31);
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    expect(server.requests).toBe(3);
  });

  it('a fetched key without a kid is never tried for a token that names a kid', async () => {
    const { ec } = keys;
    const { server, guard, token } = await setup({
      kind: 'json',
      body: { keys: [{ ...ec.publicJwk, alg: 'ES256', use: 'sig' }] },
      headers: { 'cache-control': 'max-age=3600' },
    });
    const result = await guard.verify(token('anything'));
    expect(result.ok ? 'ok' : result.error.code).toBe('key_unknown');
    expect(server.requests).toBe(1);
  });

  it('a kid is only remembered as unknown after a fetch that did not hold it, not inside the cooldown', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')), { cooldown: 30, negativeTtl: 120 });
    expect((await guard.verify(token('k1'))).ok).toBe(true); // fetch at t=0
    server.set(set(jwk('k1'), jwk('k2')));
    clock.advance(29);
    // Inside the cooldown: refused without a fetch, and so without a verdict on k2.
    const early = await guard.verify(token('k2'));
    expect(early.ok ? 'ok' : early.error.code).toBe('key_unknown');
    expect(server.requests).toBe(1);
    clock.advance(2); // t=31: the cooldown has passed since the previous fetch
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    expect(server.requests).toBe(2);

    // A failed fetch says nothing about a kid either: once the endpoint is back, the next attempt
    // after the cooldown picks the key up, not one negativeTtl (120 s) after the failure.
    server.set({ kind: 'raw', status: 503, body: 'down' });
    clock.advance(31);
    expect((await guard.verify(token('k3'))).ok).toBe(false);
    expect(server.requests).toBe(3);
    server.set(set(jwk('k1'), jwk('k2'), jwk('k3')));
    clock.advance(31);
    expect((await guard.verify(token('k3'))).ok).toBe(true);
    expect(server.requests).toBe(4);
  });

  it('case 50: the last good keys work for staleIfError past expiry while the endpoint fails, then fail closed', async () => {
    const { server, clock, guard, events, token } = await setup(set(jwk('k1')), { staleIfError: 600, cooldown: 30 });
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    server.set({ kind: 'raw', status: 503, body: 'down' });
    clock.advance(61);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    expect(events.some((event) => event.type === 'jwks-stale')).toBe(true);
    const attempts = server.requests;
    // Inside the failure cooldown no new attempt is made, however many requests arrive.
    for (let i = 0; i < 50; i++) await guard.verify(token('k1'));
    expect(server.requests).toBe(attempts);
    clock.advance(60 + 600 - 61 - 1);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(2);
    const closed = await guard.verify(token('k1'));
    expect(closed.ok).toBe(false);
    if (!closed.ok) {
      expect(closed.error.code).toBe('keys_unavailable');
      expect(closed.error.status).toBe(401);
    }
    // Recovery: the endpoint is back, the next attempt after the cooldown succeeds.
    server.set(set(jwk('k1')));
    clock.advance(31);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
  });

  // Was a defect: docs/errors.md defines `retryable` as "sending the same request again (same key, same
  // token) can succeed", and its keys_unavailable row says "retry later"; the test above shows the
  // same token accepted once the JWKS is back. Yet every GuardError said `retryable: false`.
  it('keys_unavailable says retryable: the same token succeeds once the keys come back', async () => {
    const { token, guard } = await setup({ kind: 'raw', status: 500, body: '' });
    const result = await guard.verify(token('k1'));
    expect(result.ok ? 'ok' : result.error.code).toBe('keys_unavailable');
    if (!result.ok) {
      expect(result.error.retryable).toBe(true);
      expect(result.error.toProblem().retryable).toBe(true);
    }
    // Any refusal about the token itself stays final.
    const malformed = await guard.verify('not-a-token');
    expect(!malformed.ok && malformed.error.retryable).toBe(false);
  });

  it('case 50: a hanging endpoint times out and the stale keys are used', async () => {
    // The timeout is a real timer (AbortSignal.timeout) and bounds the first fetch too, which must
    // bring the keys that later go stale: 0.2 s was a race a loaded box could lose. One second is
    // waited once, by the hanging fetch; without a timeout it would hang past the test's limit.
    const { server, clock, guard, events, token } = await setup(set(jwk('k1')), { timeout: 1 });
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    server.set({ kind: 'hang' });
    clock.advance(61);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    expect(events.some((event) => event.type === 'jwks-fetch' && !event.ok && event.reason === 'timeout')).toBe(true);
  });

  it('no keys at all when the first fetch fails: keys_unavailable', async () => {
    const { guard, token } = await setup({ kind: 'raw', status: 500, body: '' });
    const result = await guard.verify(token('k1'));
    expect(result.ok ? 'ok' : result.error.code).toBe('keys_unavailable');
  });

  const badReplies: Array<[string, JwksReply, string]> = [
    ['a redirect', { kind: 'raw', status: 302, body: '', headers: { location: '/elsewhere' } }, 'status'],
    ['a non-200 status', { kind: 'raw', status: 404, body: '{}' }, 'status'],
    ['invalid JSON', { kind: 'raw', status: 200, body: '{"keys": [' }, 'invalid-json'],
    ['duplicate JSON members', { kind: 'raw', status: 200, body: '{"keys":[],"keys":[]}' }, 'invalid-json'],
    [
      'a 10 MB body',
      { kind: 'raw', status: 200, body: `{"keys":[],"pad":"${'x'.repeat(10 * 1024 * 1024)}"}` },
      'too-large',
    ],
    ['a private key', set({ ...jwk('k9'), d: 'AAAA' }), 'private-key'],
    // Two keys it would verify with under one kid. (One it drops anyway, an encryption key say, may share it.)
    ['a duplicate kid', set(jwk('k1'), { ...otherEc, kid: 'k1', alg: 'ES256', use: 'sig' }), 'duplicate-kid'],
    // Was a defect: a broken key was dropped before kids were counted, so its twin verified alone
    // (Wycheproof json_web_key tcId 4). Which of the two the issuer signs with is unknown: refused.
    ['a kid shared with a broken key', set(jwk('k1'), { ...jwk('k1'), x: 'AAAA' }), 'duplicate-kid'],
    [
      'a kid shared with a key whose alg contradicts its type',
      set(jwk('k1'), { ...jwk('k1'), kty: 'OKP', crv: 'Ed25519' }),
      'duplicate-kid',
    ],
    ['not a key set', { kind: 'json', body: [jwk('k1')] }, 'not-a-key-set'],
    ['a symmetric key', set({ kty: 'oct', k: 'x'.repeat(43), kid: 'h' }, jwk('k1')), 'mixed-key-types'],
  ];
  for (const [label, reply, reason] of badReplies) {
    it(`case 51: ${label} is rejected and the previous set is kept`, async () => {
      const { server, clock, guard, events, token } = await setup(set(jwk('k1')));
      await guard.verify(token('k1'));
      server.set(reply);
      clock.advance(61);
      expect((await guard.verify(token('k1'))).ok).toBe(true);
      const failure = events.find((event) => event.type === 'jwks-fetch' && !event.ok);
      expect(failure?.type === 'jwks-fetch' ? failure.reason : undefined).toBe(reason);
    });
  }

  it('case 51: a body declared over maxBytes is refused on its Content-Length, without waiting for a byte of it', async () => {
    // A body that never comes, and a fetch timeout far past the test's own: only the declared length
    // can refuse it in time. Read instead, the fetch would wait for the timeout (reason 'timeout').
    const events: GuardEvent[] = [];
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      cache: false,
      onEvent: (event) => events.push(event),
      fetch: async () =>
        new Response(new ReadableStream<Uint8Array>(), {
          status: 200,
          headers: { 'content-length': String(10 * 1024 * 1024) },
        }),
      issuers: [
        { issuer: ISSUER, jwksUri: 'https://id.example/jwks', algorithms: ['ES256'], jwksOptions: { timeout: 60 } },
      ],
    });
    const result = await guard.verify(makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' } }));
    expect(result.ok ? 'ok' : result.error.code).toBe('keys_unavailable');
    expect(events).toContainEqual(expect.objectContaining({ type: 'jwks-fetch', ok: false, reason: 'too-large' }));
  });

  // A body that parses as a key set but leaves no key to verify with: nothing in it, or only keys that
  // are dropped (another use, an unsupported key type, an algorithm off the issuer's list, bad material).
  const keyless: Array<[string, JwksReply]> = [
    ['an empty key set', set()],
    [
      'a set whose every key is dropped',
      set(
        { ...jwk('enc'), use: 'enc' },
        { kty: 'XYZ', kid: 'odd' },
        { ...keys.ec384.publicJwk, kid: 'p384', alg: 'ES384' },
        { ...jwk('bad'), x: 'AAAA' },
      ),
    ],
  ];
  for (const [label, reply] of keyless) {
    it(`${label} is a failed refresh: the last good set stays, with stale-if-error, then fails closed`, async () => {
      const { server, clock, guard, events, token } = await setup(set(jwk('k1')), { staleIfError: 600, cooldown: 30 });
      expect((await guard.verify(token('k1'))).ok).toBe(true);
      server.set(reply);
      clock.advance(61);
      const stale = await guard.verify(token('k1'));
      expect(stale.ok ? 'ok' : stale.error.code).toBe('ok');
      const failure = events.find((event) => event.type === 'jwks-fetch' && !event.ok);
      expect(failure).toMatchObject({ status: 200, reason: 'no-usable-keys' });
      expect(events).toContainEqual(expect.objectContaining({ type: 'jwks-rejected', reason: 'no-usable-keys' }));
      expect(events.some((event) => event.type === 'jwks-stale')).toBe(true);
      expect(guard.stats()).toMatchObject({ jwksFetches: 2, jwksFetchFailures: 1, jwksStaleUses: 1 });
      // A failed refresh waits for the cooldown before the next attempt.
      await guard.verify(token('k1'));
      expect(server.requests).toBe(2);
      // Past expiry (60 s) plus staleIfError (600 s), still keyless: closed, as for an unreachable JWKS.
      clock.advance(600);
      const closed = await guard.verify(token('k1'));
      expect(closed.ok ? 'ok' : closed.error.code).toBe('keys_unavailable');
      server.set(set(jwk('k1')));
      clock.advance(31);
      expect((await guard.verify(token('k1'))).ok).toBe(true);
    });

    it(`${label} on the first fetch: keys_unavailable, as an unreachable JWKS`, async () => {
      const { guard, events, token } = await setup(reply);
      const result = await guard.verify(token('k1'));
      expect(result.ok ? 'ok' : result.error.code).toBe('keys_unavailable');
      expect(events).toContainEqual(
        expect.objectContaining({ type: 'jwks-fetch', ok: false, reason: 'no-usable-keys' }),
      );
      expect(guard.stats().jwksFetchFailures).toBe(1);
    });
  }

  it('refuses a non-https JWKS URL (except loopback) at construction', () => {
    expect(() =>
      createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, jwksUri: 'http://id.example/jwks' }] }),
    ).toThrow(TypeError);
  });

  it('verified-token cache: hits are counted, errors are never cached, retired keys evict', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')), {}, true);
    const first = token('k1');
    expect((await guard.verify(first)).ok).toBe(true);
    expect((await guard.verify(first)).ok).toBe(true);
    expect(guard.stats().cacheHits).toBe(1);

    // An unknown kid fails; once the key is published (after the cooldown) the same token passes.
    const early = token('k2');
    expect((await guard.verify(early)).ok).toBe(false);
    server.set(set(jwk('k1'), jwk('k2')));
    clock.advance(31);
    expect((await guard.verify(early)).ok).toBe(true);

    // k1 is retired: the refetch clears cached k1 tokens, which then fail.
    server.set(set(jwk('k2')));
    clock.advance(61);
    expect((await guard.verify(token('k2'))).ok).toBe(true);
    const after = await guard.verify(first);
    expect(after.ok ? 'ok' : after.error.code).toBe('key_unknown');
  });

  for (const withKid of [true, false]) {
    it(`verified-token cache: a key replaced ${withKid ? 'under the same kid' : 'without a kid'} evicts its tokens`, async () => {
      const rsaSet = (pair: typeof keys.rsa) =>
        set({ ...pair.publicJwk, ...(withKid ? { kid: 'k1' } : {}), alg: 'RS256' });
      const server = await startJwksServer(rsaSet(keys.rsa));
      servers.push(server);
      const clock = manualClock();
      const guard = createGuard({
        audience: AUDIENCE,
        now: clock.now,
        cache: { maxEntries: 100 },
        issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['RS256'] }],
      });
      const token = (pair: typeof keys.rsa) =>
        makeToken({
          alg: 'RS256',
          key: pair.privateKey,
          now: clock.now(),
          ...(withKid ? { header: { kid: 'k1' } } : {}),
        });
      const old = token(keys.rsa);
      expect((await guard.verify(old)).ok).toBe(true);
      // The identity provider replaces compromised key material; the kid (or its absence) stays.
      server.set(rsaSet(keys.rsa2));
      clock.advance(61);
      expect((await guard.verify(token(keys.rsa2))).ok).toBe(true);
      const after = await guard.verify(old);
      expect(after.ok ? 'ok' : after.error.code).toBe('signature_invalid');
    });
  }

  it('cooldown: an expired set is refreshed after a successful fetch, however long the cooldown', async () => {
    const reply: JwksReply = { kind: 'json', body: { keys: [jwk('k1')] }, headers: { 'cache-control': 'max-age=30' } };
    const strict = await setup(reply, { cooldown: 60, staleIfError: 0 });
    expect((await strict.guard.verify(strict.token('k1'))).ok).toBe(true);
    strict.clock.advance(31);
    const result = await strict.guard.verify(strict.token('k1'));
    expect({ code: result.ok ? 'ok' : result.error.code, fetches: strict.server.requests }).toEqual({
      code: 'ok',
      fetches: 2,
    });

    // With stale-if-error on, the keys are refreshed too, not served stale.
    const lenient = await setup(reply, { cooldown: 60 });
    await lenient.guard.verify(lenient.token('k1'));
    lenient.clock.advance(31);
    expect((await lenient.guard.verify(lenient.token('k1'))).ok).toBe(true);
    expect(lenient.server.requests).toBe(2);
    expect(lenient.events.filter((event) => event.type === 'jwks-stale')).toHaveLength(0);

    // Refresh ahead (the last tenth of the 30 s lifetime) is not held back by the cooldown either.
    const ahead = await setup(reply, { cooldown: 60 });
    await ahead.guard.verify(ahead.token('k1'));
    ahead.clock.advance(28);
    expect((await ahead.guard.verify(ahead.token('k1'))).ok).toBe(true);
    await vi.waitFor(() => expect(ahead.server.requests).toBe(2));
  });

  it('verified-token cache: a cached token passes only while its key set is usable, then fails as an uncached one', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')), { staleIfError: 600, cooldown: 30 }, true);
    const longLived = longLivedToken();
    expect((await guard.verify(longLived)).ok).toBe(true);
    expect((await guard.verify(longLived)).ok).toBe(true);
    expect(guard.stats().cacheHits).toBe(1);
    server.set({ kind: 'raw', status: 503, body: 'down' });
    // Expired set, failing endpoint, inside stale-if-error: the keys are still usable, cached or not.
    clock.advance(61);
    expect((await guard.verify(longLived)).ok).toBe(true);
    // Past expiry (60 s) plus staleIfError (600 s): the set can no longer be trusted.
    clock.advance(600);
    const uncached = await guard.verify(token('k1'));
    expect(uncached.ok ? 'ok' : uncached.error.code).toBe('keys_unavailable');
    const cached = await guard.verify(longLived);
    expect(cached.ok ? 'ok' : cached.error.code).toBe('keys_unavailable');
    // The endpoint is back: after the cooldown the token verifies again.
    server.set(set(jwk('k1')));
    clock.advance(31);
    expect((await guard.verify(longLived)).ok).toBe(true);
  });

  it('verified-token cache: hits alone keep the key set fresh, so a key the issuer retired stops a cached token', async () => {
    const { server, clock, guard } = await setup(set(jwk('k1'), jwk('k2')), { staleIfError: 600 }, true);
    const longLived = longLivedToken();
    expect((await guard.verify(longLived)).ok).toBe(true);
    // The issuer retires k1 (say it leaked). Only the cached token is presented from now on.
    server.set(set(jwk('k2')));
    clock.advance(55); // the last tenth of the 60 s lifetime: a hit starts the refresh ahead
    expect((await guard.verify(longLived)).ok).toBe(true);
    await vi.waitFor(() => expect(server.requests).toBe(2));
    const refused = await guard.verify(longLived);
    expect(refused.ok ? 'ok' : refused.error.code).toBe('key_unknown');
  });

  it('verified-token cache: a verification that looked up a key before its retirement does not cache its result', async () => {
    const { server, clock, guard, token } = await setup(set(jwk('k1')), {}, true);
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(31);
    // k1 leaked; the issuer replaces it with k2. A k1 token that lives for a day is being verified.
    const replacement = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const k2 = { ...(replacement.publicKey.export({ format: 'jwk' }) as object), kid: 'k2', alg: 'ES256', use: 'sig' };
    server.set(set(k2));
    const forged = makeToken({
      alg: 'ES256',
      key: keys.ec.privateKey,
      header: { kid: 'k1' },
      claims: { exp: START_MS / 1000 + 86_400, jti: 'forged' },
    });
    // Its signature check is held (a busy thread pool) until the new set has landed.
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const subtle = globalThis.crypto.subtle;
    const original = subtle.verify.bind(subtle);
    const spy = vi.spyOn(subtle, 'verify').mockImplementationOnce(async (...args) => {
      await held;
      return original(...args);
    });
    try {
      const inFlight = guard.verify(forged);
      // An unknown kid past the cooldown fetches the new set: k1 is retired, the issuer's entries dropped.
      const fresh = makeToken({ alg: 'ES256', key: replacement.privateKey, header: { kid: 'k2' }, now: clock.now() });
      expect((await guard.verify(fresh)).ok).toBe(true);
      expect(server.requests).toBe(2);
      release();
      // It looked k1 up while k1 was still current, so this one answer stands ...
      expect((await inFlight).ok).toBe(true);
    } finally {
      spy.mockRestore();
    }
    // ... but it was not cached: the token now meets the current set.
    const again = await guard.verify(forged);
    expect(again.ok ? 'ok' : again.error.code).toBe('key_unknown');
    expect(guard.stats().cacheHits).toBe(0);
  });

  it('verified-token cache: past the set lifetime with a healthy endpoint, a hit waits for the refresh, not stale-if-error', async () => {
    const { server, clock, guard } = await setup(set(jwk('k1'), jwk('k2')), { staleIfError: 600 }, true);
    const longLived = longLivedToken();
    expect((await guard.verify(longLived)).ok).toBe(true);
    server.set(set(jwk('k2')));
    // No request at all during the last tenth: the first one comes after expiry. Stale-if-error is
    // for a failing endpoint; this one answers, so the cached token must meet the new set.
    clock.advance(120);
    const refused = await guard.verify(longLived);
    expect(refused.ok ? 'ok' : refused.error.code).toBe('key_unknown');
    expect(server.requests).toBe(2);
  });

  it('case 42: a weak key in a fetched set is dropped, and the rest of the set stays usable', async () => {
    const weak = { ...keys.rsa1024.publicJwk, kid: 'weak', alg: 'RS256', use: 'sig' };
    const exponentOne = { ...keys.rsa.publicJwk, e: 'AQ', kid: 'e1', alg: 'RS256', use: 'sig' };
    const good = { ...keys.rsa.publicJwk, kid: 'good', alg: 'RS256', use: 'sig' };
    const server = await startJwksServer(set(weak, exponentOne, good, jwk('k1')));
    servers.push(server);
    const events: GuardEvent[] = [];
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: false,
      onEvent: (event) => events.push(event),
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256', 'RS256'] }],
    });
    const rs256 = (kid: string, key = keys.rsa.privateKey) =>
      makeToken({ alg: 'RS256', key, header: { kid }, now: clock.now() });
    expect((await guard.verify(rs256('good'))).ok).toBe(true);
    expect(
      (
        await guard.verify(
          makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() }),
        )
      ).ok,
    ).toBe(true);
    const signedByWeak = await guard.verify(rs256('weak', keys.rsa1024.privateKey));
    expect(signedByWeak.ok ? 'ok' : signedByWeak.error.code).toBe('key_unknown');
    // The e=1 entry carries the good modulus: a token signed by the good key under its kid is refused too.
    const underExponentOne = await guard.verify(rs256('e1'));
    expect(underExponentOne.ok ? 'ok' : underExponentOne.error.code).toBe('key_unknown');
    const dropped = events.filter((event) => event.type === 'jwks-key-dropped');
    expect(dropped).toEqual([
      expect.objectContaining({ kid: 'weak', reason: 'weak-key' }),
      expect.objectContaining({ kid: 'e1', reason: 'weak-key' }),
    ]);
  });

  it('verified-token cache: during an outage a hit is served from the stale keys and never waits for the retry', async () => {
    const { server, clock, guard } = await setup(
      set(jwk('k1')),
      { staleIfError: 600, cooldown: 30, timeout: 30 },
      true,
    );
    const longLived = longLivedToken();
    expect((await guard.verify(longLived)).ok).toBe(true);
    server.set({ kind: 'raw', status: 503, body: 'down' });
    clock.advance(61);
    expect((await guard.verify(longLived)).ok).toBe(true); // the failed refresh, then the stale keys
    // Past the cooldown the endpoint hangs: the next attempt starts, and would take 30 s to time out.
    server.set({ kind: 'hang' });
    clock.advance(31);
    const waited = new Promise((resolve) => setTimeout(() => resolve('waited for the fetch'), 2000).unref());
    const hit = await Promise.race([guard.verify(longLived), waited]);
    expect(hit).toMatchObject({ ok: true });
    expect(guard.stats().cacheHits).toBeGreaterThanOrEqual(1);
    await vi.waitFor(() => expect(server.requests).toBe(3));
  });

  it('verified-token cache entries die at exp', async () => {
    const { clock, guard } = await setup(set(jwk('k1')), {}, true);
    const shortLived = makeToken({
      alg: 'ES256',
      key: keys.ec.privateKey,
      header: { kid: 'k1' },
      claims: { exp: START_MS / 1000 + 10 },
    });
    expect((await guard.verify(shortLived)).ok).toBe(true);
    // Past exp plus the 5 s tolerance: the cache must not answer for it.
    clock.advance(16);
    const result = await guard.verify(shortLived);
    expect(result.ok ? 'ok' : result.error.code).toBe('token_expired');
    expect(guard.stats().cacheHits).toBe(0);
  });
});

describe('verified-token cache (unit)', () => {
  const principal = { sub: 'user-1' } as unknown as Principal;

  it('keys bound entries on token and proof key together, apart from every bearer input', () => {
    const cache = createTokenCache(10, () => true);
    cache.set('a.b.c', 'jkt-1', principal, 1000, ISSUER, cache.epoch(ISSUER));
    expect(cache.get('a.b.c', 'jkt-1', 0)?.principal).toBe(principal);
    expect(cache.get('a.b.c', 'jkt-2', 0)).toBeUndefined();
    expect(cache.get('a.b.c', undefined, 0)).toBeUndefined();
    // No bearer token string, whatever it holds, lands on the bound entry.
    expect(cache.get('jkt-1:a.b.c', undefined, 0)).toBeUndefined();
    expect(cache.get('d:jkt-1:a.b.c', undefined, 0)).toBeUndefined();
    cache.set('x.y.z', undefined, principal, 1000, ISSUER, cache.epoch(ISSUER));
    expect(cache.get('x.y.z', undefined, 0)?.principal).toBe(principal);
    expect(cache.get('x.y.z', '', 0)).toBeUndefined();
  });

  it('holds at most maxEntries, the oldest going first', () => {
    const cache = createTokenCache(2, () => true);
    for (const token of ['t1', 't2', 't3']) cache.set(token, undefined, principal, 1000, ISSUER, 0);
    expect(cache.size).toBe(2);
    expect(cache.get('t1', undefined, 0)).toBeUndefined();
    expect(cache.get('t2', undefined, 0)).toBeDefined();
    expect(cache.get('t3', undefined, 0)).toBeDefined();
    expect(() => createTokenCache(0, () => true)).toThrow(TypeError);
  });
});

describe('key import (unit)', () => {
  const keys = testKeys();

  it('an oct key is refused unless the policy allows symmetric keys', () => {
    const oct = { kty: 'oct', k: randomBytes(32).toString('base64url'), alg: 'HS256' };
    expect(checkJwk(oct, { algorithms: ['HS256'], allowSymmetric: false })).toEqual({
      ok: false,
      reason: 'symmetric-not-allowed',
    });
    expect(checkJwk(oct, { algorithms: ['HS256'], allowSymmetric: true }).ok).toBe(true);
  });

  it('a key set holding any private RSA member is refused whole, not only one with d', async () => {
    const policy = { algorithms: ['RS256'] as const, allowSymmetric: false };
    for (const member of ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth']) {
      const result = await importKeySet({ keys: [{ ...keys.rsa.publicJwk, [member]: 'AQAB' }] }, policy);
      expect(result, member).toEqual({ ok: false, reason: 'private-key' });
    }
    expect((await importKeySet({ keys: [keys.rsa.publicJwk] }, policy)).ok).toBe(true);
  });
});

describe('one kid, two algorithms', () => {
  // Was a defect: one RSA key listed twice under one kid, for RS256 and for PS256 (Keycloak publishes
  // this, and FAPI providers), was refused as a duplicate kid: the whole set, so every token of the
  // issuer got keys_unavailable. Every key is pinned to one algorithm and a lookup asks for the
  // token's, so the two entries never compete; two keys under one kid for one algorithm still do.
  const rsaFor = (alg: string, pair = keys.rsa) => ({ ...pair.publicJwk, kid: 'k1', alg, use: 'sig' });
  const policy = { algorithms: ['RS256', 'PS256'] as const, allowSymmetric: false };

  it('takes one key under one kid for RS256 and for PS256, and verifies tokens of both', async () => {
    const imported = await importKeySet({ keys: [rsaFor('RS256'), rsaFor('PS256')] }, policy);
    expect(imported.ok && imported.keys.map((key) => key.alg)).toEqual(['RS256', 'PS256']);
    const guard = createGuard({
      audience: AUDIENCE,
      issuers: [{ issuer: ISSUER, jwks: { keys: [rsaFor('RS256'), rsaFor('PS256')] }, algorithms: ['RS256', 'PS256'] }],
      now: () => START_MS,
    });
    for (const alg of ['RS256', 'PS256']) {
      const token = makeToken({ alg, key: keys.rsa.privateKey, header: { kid: 'k1' } });
      const result = await guard.verify(token);
      expect(result.ok ? alg : result.error.code).toBe(alg);
    }
  });

  it('still refuses two keys under one kid for one algorithm', async () => {
    const result = await importKeySet({ keys: [rsaFor('RS256'), rsaFor('RS256', keys.rsa2)] }, policy);
    expect(result).toEqual({ ok: false, reason: 'duplicate-kid' });
    // A kid shared with a broken key stays refused whatever the algorithms say.
    const broken = { ...rsaFor('PS256'), n: 'AAAA' };
    expect(await importKeySet({ keys: [rsaFor('RS256'), broken] }, policy)).toEqual({
      ok: false,
      reason: 'duplicate-kid',
    });
  });
});

describe('remote JWKS when the wall clock is set back', () => {
  // No injected `now`: the guard runs on its own clocks, and its wall clock (Date.now, replaced before
  // the guard takes it) is stepped back an hour, as NTP or a resumed VM does.
  const realNow = Date.now;
  let offset = 0;
  afterEach(() => {
    vi.restoreAllMocks();
    offset = 0;
  });
  async function realClockGuard(
    reply: JwksReply,
    jwksOptions: NonNullable<GuardOptions['issuers'][number]['jwksOptions']>,
  ) {
    vi.spyOn(Date, 'now').mockImplementation(() => realNow() + offset);
    const server = await startJwksServer(reply);
    servers.push(server);
    const guard = createGuard({
      audience: AUDIENCE,
      cache: false,
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'], jwksOptions }],
    });
    const token = (kid: string, pair = keys.ec) =>
      makeToken({ alg: 'ES256', key: pair.privateKey, header: { kid }, now: Date.now() });
    return { server, guard, token };
  }
  const other = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const otherPair = { ...keys.ec, privateKey: other.privateKey, publicJwk: other.publicKey.export({ format: 'jwk' }) };

  it('fetches for a new kid at once: the cooldown is not held back by the hour the wall clock lost', async () => {
    // Was a defect: the cooldown was `Date.now() - lastAttempt`, negative for that hour, so a rotated
    // key was refused as unknown until the wall clock caught up.
    const { server, guard, token } = await realClockGuard(set(jwk('k1')), { cooldown: 0 });
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    offset = -3_600_000;
    server.set(set(jwk('k1'), jwk('k2', otherPair)));
    expect(await guard.verify(token('k2', otherPair))).toMatchObject({ ok: true });
    expect(server.requests).toBe(2);
  });

  it('does not keep a key set fresh for the hour the wall clock lost', async () => {
    // Was a defect: the set's lifetime was compared with Date.now, so a set already past its
    // lifetime read as fresh for another hour, and a key the issuer had retired kept verifying.
    const { server, guard, token } = await realClockGuard(
      { kind: 'json', body: { keys: [jwk('k1')] }, headers: { 'cache-control': 'max-age=0' } },
      { minTtl: 0 },
    );
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    offset = -3_600_000;
    server.set(set(jwk('k2', otherPair)));
    expect(await guard.verify(token('k1'))).toMatchObject({ ok: false, error: { code: 'key_unknown' } });
    expect(server.requests).toBe(2);
  });
});

describe('guard.refreshKeys(): a compromised key withdrawn at the issuer', () => {
  const codeOf = (result: Awaited<ReturnType<ReturnType<typeof createGuard>['verify']>>) =>
    result.ok ? 'ok' : result.error.code;
  const hourLong = (...entries: object[]): JwksReply => ({
    kind: 'json',
    body: { keys: entries },
    headers: { 'cache-control': 'max-age=3600' },
  });

  it('refuses the withdrawn key’s tokens at once, cached ones too, without waiting out the set’s hour', async () => {
    const { server, guard, token } = await setup(hourLong(jwk('k1'), jwk('k2', keys.ec2)), {}, true);
    const stolen = token('k1');
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    server.set(hourLong(jwk('k2', keys.ec2)));
    // The set is fresh for an hour and the token is cached: it still passes.
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(codeOf(await guard.verify(stolen))).toBe('key_unknown');
    expect(codeOf(await guard.verify(token('k2', keys.ec2)))).toBe('ok');
    expect(server.requests).toBe(2);
  });

  it('fetches inside the cooldown that holds back the fetches unknown kids provoke', async () => {
    const { server, clock, guard, token } = await setup(hourLong(jwk('k1')));
    expect(codeOf(await guard.verify(token('k1')))).toBe('ok');
    server.set(hourLong(jwk('k1'), jwk('k2', keys.ec2)));
    clock.advance(31);
    expect(codeOf(await guard.verify(token('k2', keys.ec2)))).toBe('ok');
    server.set(hourLong(jwk('k2', keys.ec2)));
    // The kid fetch just now started a cooldown: only an operator's refresh fetches again.
    expect(codeOf(await guard.verify(token('k1')))).toBe('ok');
    expect(await guard.refreshKeys(ISSUER)).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(codeOf(await guard.verify(token('k1')))).toBe('key_unknown');
    expect(server.requests).toBe(3);
  });

  it('does not take the answer of a fetch that left before the call: it fetches again after it', async () => {
    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const { server, guard, token } = await setup({ kind: 'gated', gate, reply: hourLong(jwk('k1')) });
    const first = guard.verify(token('k1'));
    await vi.waitFor(() => expect(server.requests).toBe(1));
    // The issuer withdraws k1 while the first fetch, which already has its answer, is on its way.
    server.set(hourLong(jwk('k2', keys.ec2)));
    const refreshed = guard.refreshKeys();
    open();
    expect(codeOf(await first)).toBe('ok');
    expect(await refreshed).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(server.requests).toBe(2);
    expect(codeOf(await guard.verify(token('k1')))).toBe('key_unknown');
  });

  it('reports a failed fetch and keeps the keys it holds', async () => {
    const { server, guard, token, events } = await setup(hourLong(jwk('k1')));
    expect(codeOf(await guard.verify(token('k1')))).toBe('ok');
    server.set({ kind: 'raw', status: 503, body: '{}' });
    expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'failed' }]);
    expect(events.filter((event) => event.type === 'jwks-fetch').at(-1)).toMatchObject({ ok: false, status: 503 });
    expect(codeOf(await guard.verify(token('k1')))).toBe('ok');
  });

  it('fetches only the issuer named, answers configured keys as such, and rejects an issuer not configured', async () => {
    const one = await startJwksServer(hourLong(jwk('k1')));
    const two = await startJwksServer(hourLong(jwk('k1')));
    servers.push(one, two);
    const guard = createGuard({
      audience: AUDIENCE,
      issuers: [
        { issuer: 'https://one.example', jwksUri: one.url, algorithms: ['ES256'] },
        { issuer: 'https://two.example', jwksUri: two.url, algorithms: ['ES256'] },
        { issuer: 'https://local.example', jwks: { keys: [jwk('k1')] }, algorithms: ['ES256'] },
      ],
    });
    expect(await guard.refreshKeys('https://two.example')).toEqual([
      { issuer: 'https://two.example', outcome: 'fetched' },
    ]);
    expect([one.requests, two.requests]).toEqual([0, 1]);
    expect(await guard.refreshKeys()).toEqual([
      { issuer: 'https://one.example', outcome: 'fetched' },
      { issuer: 'https://two.example', outcome: 'fetched' },
      { issuer: 'https://local.example', outcome: 'configured' },
    ]);
    await expect(guard.refreshKeys('https://elsewhere.example')).rejects.toThrow(TypeError);
  });
});
