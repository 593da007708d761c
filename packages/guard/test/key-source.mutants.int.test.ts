import { SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type GuardEvent, type GuardResult } from '../src/index.js';
import { esKey, handlerServer, jsonAnswer } from './support/handler-server.js';

// Tests written by a mutation-testing pass over key-source.ts: each kills a mutant the other guard
// tests let live (named in its comment). Real HTTP JWKS servers on loopback, an injected clock.

const ISS = 'https://id.example';
const AUD = 'https://api.example';

const json = jsonAnswer;

function sign(privateKey: CryptoKey, kid: string, nowMs: number) {
  const iat = Math.floor(nowMs / 1000);
  return new SignJWT({ sub: 'u1' })
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid })
    .setIssuer(ISS)
    .setAudience(AUD)
    .setIssuedAt(iat)
    .setExpirationTime(iat + 7200)
    .sign(privateKey);
}

function edge(uri: string, now: () => number) {
  const events: GuardEvent[] = [];
  const guard = createGuard({
    audience: AUD,
    cache: false,
    now,
    onEvent: (event) => events.push(event),
    issuers: [{ issuer: ISS, jwksUri: uri, algorithms: ['ES256'], jwksOptions: { cooldown: 30 } }],
  });
  return { guard, events };
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('key source (mutants)', () => {
  // Kills: the 1 s, 2 s, 4 s back-off applied while stale keys are held (it is for an empty source only).
  it('with stale keys in hand, a failing endpoint is retried once per cooldown, not on the back-off', async () => {
    const key = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }, { 'cache-control': 'max-age=60' }),
    );
    const { guard } = edge(server.url, () => now);
    const token = await sign(key.privateKey, 'k1', now);
    expect(code(await guard.verify(token))).toBe('ok');
    server.set(json({}, {}, 503));
    now += 61_000;
    expect(code(await guard.verify(token))).toBe('ok'); // the first refresh after expiry fails: stale keys
    const after = server.requests;
    for (const step of [1_000, 2_000, 4_000, 8_000, 14_999]) {
      now += step;
      expect(code(await guard.verify(token))).toBe('ok');
    }
    expect(server.requests).toBe(after);
    now += 1;
    await guard.verify(token);
    await expect.poll(() => server.requests).toBe(after + 1);
  });

  // Kills: the jwks-stale event dropped where stale keys answer at once (between retries of an outage).
  it('tells jwks-stale for every answer given with stale keys, not only the one that waited', async () => {
    const key = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }, { 'cache-control': 'max-age=60' }),
    );
    const { guard, events } = edge(server.url, () => now);
    const token = await sign(key.privateKey, 'k1', now);
    await guard.verify(token);
    server.set(json({}, {}, 503));
    now += 61_000;
    await guard.verify(token); // waits for the failed refresh
    now += 5_000;
    await guard.verify(token); // answered at once, inside the cooldown
    const stale = events.filter((event) => event.type === 'jwks-stale');
    expect(stale.map((event) => (event.type === 'jwks-stale' ? event.ageMs : 0))).toEqual([61_000, 66_000]);
  });

  // Kills: recheck answering `found` with no keys when the refetch brought nothing new (the
  // refusal would turn into algorithm_not_allowed).
  it('a bad signature under a known kid stays signature_invalid when the refetch brings the same set', async () => {
    const key = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }, { 'cache-control': 'max-age=3600' }),
    );
    const { guard } = edge(server.url, () => now);
    expect(code(await guard.verify(await sign(key.privateKey, 'k1', now)))).toBe('ok');
    now += 31_000;
    const fetches = server.requests;
    const forged = await sign((await esKey()).privateKey, 'k1', now);
    expect(code(await guard.verify(forged))).toBe('signature_invalid');
    expect(server.requests).toBe(fetches + 1);
  });

  // Kills: either half of the userinfo check dropped (a token as the user name alone, a password alone).
  it('refuses a jwksUri holding a user name alone or a password alone', () => {
    for (const uri of ['http://secret-token@127.0.0.1:9/jwks', 'http://:secret@127.0.0.1:9/jwks']) {
      expect(() => edge(uri, Date.now)).toThrow(TypeError);
    }
  });

  // Kills (verify.ts): the signature not verified again with what the recheck brought; the token that
  // triggers the refetch must itself pass, not only the ones after it.
  it('the first token signed with new material under a known kid passes on the refetch it triggers', async () => {
    const first = await esKey();
    const second = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...first.jwk, kid: 'main', alg: 'ES256' }] }, { 'cache-control': 'max-age=3600' }),
    );
    const { guard } = edge(server.url, () => now);
    expect(code(await guard.verify(await sign(first.privateKey, 'main', now)))).toBe('ok');
    server.set(json({ keys: [{ ...second.jwk, kid: 'main', alg: 'ES256' }] }, { 'cache-control': 'max-age=3600' }));
    now += 31_000;
    expect(code(await guard.verify(await sign(second.privateKey, 'main', now)))).toBe('ok');
    expect(server.requests).toBe(2);
  });
});
