import { generateKeyPairSync } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { importJWK, type JWK, SignJWT } from 'jose';
import { describe, expect, it, vi } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  type GuardEvent,
  type GuardResult,
  principalFromClaims,
} from '../src/index.js';
import { esKey, type Handler, handlerServer, jsonAnswer } from './support/handler-server.js';

// Audit (branch audit-guard): the key source under failure and the operations around it. Real HTTP
// JWKS servers on ephemeral ports, keys made with jose. The first rows pin behaviour that was probed
// and held but had no test; the "defects" rows state behaviour the audit found missing, fixed since.

const ISS = 'https://id.example';
const AUD = 'https://api.example';

const json = jsonAnswer;
const hang: Handler = () => {};

function sign(privateKey: CryptoKey, header: Record<string, unknown>, nowMs = Date.now()) {
  const iat = Math.floor(nowMs / 1000);
  return new SignJWT({ sub: 'u1' })
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', ...header })
    .setIssuer(ISS)
    .setAudience(AUD)
    .setIssuedAt(iat)
    .setExpirationTime(iat + 7200)
    .sign(privateKey);
}

function edge(uri: string, jwksOptions: Record<string, unknown> = {}, now: () => number = Date.now) {
  const events: GuardEvent[] = [];
  const guard = createGuard({
    audience: AUD,
    cache: false,
    now,
    onEvent: (event) => events.push(event),
    issuers: [{ issuer: ISS, jwksUri: uri, algorithms: ['ES256'], jwksOptions }],
  });
  return { guard, events };
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);
const fetchReason = (events: GuardEvent[]) =>
  events.flatMap((event) => (event.type === 'jwks-fetch' ? [event.ok ? 'ok' : event.reason] : []));

describe('audit: JWKS endpoint failures that hold', () => {
  it('200 concurrent first requests against a slow (0.5 s) endpoint share one fetch', async () => {
    const key = await esKey();
    const server = await handlerServer((req, res) =>
      setTimeout(() => json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] })(req, res), 500),
    );
    const { guard } = edge(server.url);
    const token = await sign(key.privateKey, { kid: 'k1' });
    const results = await Promise.all(Array.from({ length: 200 }, () => guard.verify(token)));
    expect(results.every((result) => result.ok)).toBe(true);
    expect(server.requests).toBe(1);
  });

  it('a gzip bomb is cut at maxBytes after decompression; a gzip set is read', async () => {
    const key = await esKey();
    const bomb = gzipSync(Buffer.from(`{"keys":[],"pad":"${'0'.repeat(50 * 1024 * 1024)}"}`));
    const server = await handlerServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
      res.end(bomb);
    });
    const { guard, events } = edge(server.url);
    expect(code(await guard.verify(await sign(key.privateKey, { kid: 'k1' })))).toBe('keys_unavailable');
    expect(fetchReason(events)).toEqual(['too-large']);

    const good = gzipSync(Buffer.from(JSON.stringify({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] })));
    const server2 = await handlerServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
      res.end(good);
    });
    expect(code(await edge(server2.url).guard.verify(await sign(key.privateKey, { kid: 'k1' })))).toBe('ok');
  });

  it('a body that drips slower than the timeout is aborted at the timeout', async () => {
    const key = await esKey();
    const server = await handlerServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"keys":[');
      const timer = setInterval(() => res.write(' '), 100);
      res.on('close', () => clearInterval(timer));
    });
    const { guard, events } = edge(server.url, { timeout: 0.5 });
    const started = performance.now();
    expect(code(await guard.verify(await sign(key.privateKey, { kid: 'k1' })))).toBe('keys_unavailable');
    expect(performance.now() - started).toBeLessThan(1500);
    expect(fetchReason(events)).toEqual(['timeout']);
  });

  it('an HTML login page (200) and a 203 are failed fetches', async () => {
    const key = await esKey();
    const token = await sign(key.privateKey, { kid: 'k1' });
    const html = await handlerServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>sign in</html>');
    });
    const nonAuthoritative = await handlerServer(json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }, {}, 203));
    for (const [uri, reason] of [
      [html.url, 'invalid-json'],
      [nonAuthoritative.url, 'status'],
    ] as const) {
      const { guard, events } = edge(uri);
      expect(code(await guard.verify(token))).toBe('keys_unavailable');
      expect(fetchReason(events)).toEqual([reason]);
    }
  });

  it('unsupported kty, use "enc" and non-string kids are dropped one by one; the rest of the set works', async () => {
    const key = await esKey();
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({ format: 'jwk' });
    const server = await handlerServer(
      json({
        keys: [
          { kty: 'AKP', alg: 'ML-DSA-44', kid: 'pq', pub: 'AAAA' },
          { ...rsa, kid: 'e1', use: 'enc', alg: 'RSA-OAEP' },
          { ...key.jwk, kid: 7, alg: 'ES256' },
          { ...key.jwk, kid: 'k1', alg: 'ES256' },
        ],
      }),
    );
    const { guard, events } = edge(server.url);
    expect(code(await guard.verify(await sign(key.privateKey, { kid: 'k1' })))).toBe('ok');
    expect(events.filter((event) => event.type === 'jwks-key-dropped')).toHaveLength(3);
  });
});

describe('audit: defects found, fixed', () => {
  // Was wrong: after rotate(key, { delay: 0 }) (security.md/guard.md's remedy for a compromised key) the old key stays published among the newest maxPublishedKeys, so services accept tokens minted with it forever; expected: it is withdrawn once its own tokens expired.
  it('F1: after rotate(key, { delay: 0 }) the compromised key stops verifying (here: 48 h later)', async () => {
    let now = Date.now();
    const stolen = generateKeyPairSync('ed25519').privateKey;
    const issuer = createInternalTokenIssuer({
      issuer: 'https://gw',
      keys: [{ kid: 'old', privateKey: stolen }],
      now: () => now,
    });
    const server = await handlerServer((_req, res) => json(issuer.jwks())(_req, res));
    const verifier = createInternalVerifier({
      issuer: 'https://gw',
      audience: 'orders',
      jwksUri: server.url,
      now: () => now,
      cache: false,
    });
    expect(
      (
        await verifier.verify(
          await issuer.mint(principalFromClaims({ sub: 'u', iss: ISS, aud: AUD }), { audience: 'orders' }),
        )
      ).ok,
    ).toBe(true);
    issuer.rotate(undefined, { delay: 0 });
    now += 48 * 3600_000;
    const iat = Math.floor(now / 1000);
    const forged = await new SignJWT({ scope: 'admin', orig_iss: ISS, orig_aud: [AUD] })
      .setProtectedHeader({ alg: 'EdDSA', kid: 'old', typ: 'internal+jwt' })
      .setIssuer('https://gw')
      .setSubject('attacker')
      .setAudience('orders')
      .setIssuedAt(iat)
      .setExpirationTime(iat + 60)
      .sign(await importJWK(stolen.export({ format: 'jwk' }) as JWK, 'EdDSA'));
    expect(issuer.jwks().keys.map((key) => key.kid)).not.toContain('old');
    expect(code(await verifier.verify(forged))).not.toBe('ok');
  });

  // Was wrong: when the first fetch fails (IdP or mesh sidecar not up yet) every request is 401 keys_unavailable for the whole 30 s cooldown after the endpoint is back (jose retries on the next request); expected: with no keys at all, a recovered endpoint is tried again within seconds (research case 50).
  it('F3: with no keys at all, a recovered endpoint is retried within seconds, not after the 30 s cooldown', async () => {
    const key = await esKey();
    let now = Date.now();
    const server = await handlerServer(json({}, {}, 503));
    const { guard } = edge(server.url, {}, () => now);
    const token = await sign(key.privateKey, { kid: 'k1' }, now);
    expect(code(await guard.verify(token))).toBe('keys_unavailable');
    server.set(json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }));
    now += 5_000;
    expect(code(await guard.verify(token))).toBe('ok');
  });

  // Was wrong: during an outage each retry (every cooldown) makes every uncached request wait the whole fetch timeout (5 s every 30 s on a black-holed IdP) although stale keys are in hand; expected: stale-while-revalidate, as guard.md promises for cache hits (research section 10 item 2).
  it('F4: during an outage with stale keys, an uncached token does not wait for the retry timeout', async () => {
    const key = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256' }] }, { 'cache-control': 'max-age=60' }),
    );
    const { guard, events } = edge(server.url, { timeout: 0.5, cooldown: 30 }, () => now);
    const token = await sign(key.privateKey, { kid: 'k1' }, now);
    expect(code(await guard.verify(token))).toBe('ok');
    server.set(hang);
    now += 61_000;
    await guard.verify(token); // the first retry after expiry: waits, fails, stale keys used
    now += 31_000; // the cooldown has passed: the next request starts the next retry
    const failedBefore = fetchReason(events).length;
    const requestsBefore = server.requests;
    expect(code(await guard.verify(token))).toBe('ok');
    // Answered with the stale keys while the retry it started is still out (it has not timed out).
    expect(fetchReason(events)).toHaveLength(failedBefore);
    await vi.waitFor(() => expect(server.requests).toBe(requestsBefore + 1));
    expect(events.some((event) => event.type === 'jwks-stale')).toBe(true);
  });

  it('F3 (cont.): with no keys, retries back off 1 s, 2 s, 4 s ... up to the cooldown', async () => {
    let now = Date.now();
    const server = await handlerServer(json({}, {}, 503));
    const { guard } = edge(server.url, {}, () => now);
    const token = await sign((await esKey()).privateKey, { kid: 'k1' }, now);
    const fetchesAfter = async (ms: number) => {
      now += ms;
      await guard.verify(token);
      return server.requests;
    };
    expect(await fetchesAfter(0)).toBe(1);
    expect(await fetchesAfter(999)).toBe(1);
    expect(await fetchesAfter(1)).toBe(2); // 1 s after the first failure
    expect(await fetchesAfter(1_999)).toBe(2);
    expect(await fetchesAfter(1)).toBe(3); // 2 s after the second
    expect(await fetchesAfter(4_000)).toBe(4);
    expect(await fetchesAfter(8_000)).toBe(5);
    expect(await fetchesAfter(16_000)).toBe(6);
    expect(await fetchesAfter(29_999)).toBe(6); // capped at the 30 s cooldown
    expect(await fetchesAfter(1)).toBe(7);
  });

  // Was wrong: new material under a known kid (security.md's "compromised key replaced" case) or a kid-less rotation is signature_invalid with no refetch until the cached set expires (600 s default, up to 86,400 s); expected: one refetch per cooldown, as a kid miss gets.
  it('F5: new material under a known kid is picked up after one refetch once the cooldown allows', async () => {
    const first = await esKey();
    const second = await esKey();
    let now = Date.now();
    const server = await handlerServer(
      json({ keys: [{ ...first.jwk, kid: 'main', alg: 'ES256' }] }, { 'cache-control': 'max-age=3600' }),
    );
    const { guard } = edge(server.url, {}, () => now);
    expect(code(await guard.verify(await sign(first.privateKey, { kid: 'main' }, now)))).toBe('ok');
    server.set(json({ keys: [{ ...second.jwk, kid: 'main', alg: 'ES256' }] }, { 'cache-control': 'max-age=3600' }));
    now += 31_000;
    const fetches = server.requests;
    // A forged signature under the known kid costs one refetch per cooldown, no more.
    const forged = await sign((await esKey()).privateKey, { kid: 'main' }, now);
    expect(code(await guard.verify(forged))).toBe('signature_invalid');
    expect(code(await guard.verify(forged))).toBe('signature_invalid');
    expect(server.requests).toBe(fetches + 1);
    // The refetch brought the new material: tokens it signed verify.
    expect(code(await guard.verify(await sign(second.privateKey, { kid: 'main' }, now)))).toBe('ok');
    expect(server.requests).toBe(fetches + 1);
  });

  // Was wrong: jwksOptions.maxBytes/maxUnknownKids are never checked, so NaN (Number(env) unset) lifts the body bound (a 20 MB body was read); expected: a TypeError at startup, as security.md promises for limits ("a configuration cannot lift a bound by accident").
  it('F6: jwksOptions.maxBytes NaN is refused at construction', () => {
    for (const bad of [Number.NaN, 0, -1, 1.5, Number.POSITIVE_INFINITY]) {
      expect(() => edge('http://127.0.0.1:9/jwks', { maxBytes: bad })).toThrow(TypeError);
      expect(() => edge('http://127.0.0.1:9/jwks', { maxUnknownKids: bad })).toThrow(TypeError);
    }
  });

  // Was wrong: duplicate kids are counted before unusable keys are dropped, so an enc key sharing the signing key's kid (allowed across key types, RFC 7517 §4.5) refuses the whole set; expected: the enc key is dropped and the set used.
  it('F7: a kid shared with a key the guard drops anyway (use "enc", another kty) does not refuse the set', async () => {
    const key = await esKey();
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({ format: 'jwk' });
    const server = await handlerServer(
      json({
        keys: [
          { ...rsa, kid: 'k1', use: 'enc', alg: 'RSA-OAEP' },
          { ...key.jwk, kid: 'k1', use: 'sig', alg: 'ES256' },
        ],
      }),
    );
    expect(code(await edge(server.url).guard.verify(await sign(key.privateKey, { kid: 'k1' })))).toBe('ok');
  });
});
