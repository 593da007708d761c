import { createPublicKey, generateKeyPairSync, type KeyObject, randomBytes, X509Certificate } from 'node:crypto';
import { rootCertificates } from 'node:tls';
import { describe, expect, it, vi } from 'vitest';
import {
  createGuard,
  type GuardErrorCode,
  type GuardEvent,
  type GuardOptions,
  type GuardResult,
  type IssuerOptions,
} from '../src/index.js';
import { isRocaModulus } from '../src/roca.js';
import { startJwksServer } from './support/jwks-server.js';
import {
  AUDIENCE,
  b64url,
  ISSUER,
  makeToken,
  manualClock,
  SECRET,
  START_MS,
  signSegments,
  testKeys,
} from './support/tokens.js';

// Research section 2 (jwt-guard-anchors.md), one `case N` per row. HTTP-level rows (1-6, 44, 47, 48,
// 53-55) also run on Express, Fastify and Koa through the glue (packages/*/test/auth.test.ts).

const keys = testKeys();

function guardWith(issuer: Record<string, unknown> = {}, options: Partial<GuardOptions> = {}) {
  const clock = manualClock();
  return createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: false,
    ...options,
    issuers: [{ issuer: ISSUER, secret: SECRET, ...issuer } as unknown as IssuerOptions],
  });
}

const rsaIssuer = (extra: Record<string, unknown> = {}) =>
  guardWith({ secret: undefined, publicKeys: [keys.rsa.publicPem], algorithms: ['RS256'], ...extra });

function expectCode(result: GuardResult, code: GuardErrorCode) {
  expect(result.ok).toBe(false);
  if (!result.ok) expect(result.error.code).toBe(code);
}

function expectOk(result: GuardResult) {
  if (!result.ok) throw new Error(`expected success, got ${result.error.code}`);
  return result.principal;
}

const bearer = (token: string) => ({ method: 'GET', url: '/', headers: { authorization: `Bearer ${token}` } });

describe('request-level cases', () => {
  const guard = guardWith();
  const token = makeToken();

  it('case 1: no Authorization header gives 401 with a challenge without error', async () => {
    const result = await guard.authenticate({ headers: {} });
    expectCode(result, 'token_missing');
    if (!result.ok) {
      expect(result.error.status).toBe(401);
      expect(result.error.wwwAuthenticate).toBe('Bearer realm="api"');
    }
  });

  it('case 2: Basic, Token and DPoP schemes are treated as no bearer token', async () => {
    for (const scheme of ['Basic', 'Token', 'DPoP']) {
      const result = await guard.authenticate({ headers: { authorization: `${scheme} ${token}` } });
      expectCode(result, 'token_missing');
    }
  });

  it('case 3: scheme case variants and several spaces are accepted; tabs and junk are not', async () => {
    for (const value of [`bearer ${token}`, `BEARER ${token}`, `Bearer  ${token}`]) {
      expectOk(await guard.authenticate({ headers: { authorization: value } }));
    }
    for (const value of [`Bearer\t${token}`, `Bearer ${token} junk`, `Bearer ${token}\t`]) {
      const result = await guard.authenticate({ headers: { authorization: value } });
      expectCode(result, 'authorization_malformed');
      if (!result.ok) expect(result.error.status).toBe(400);
    }
  });

  it('case 4: an empty bearer token is 400 invalid_request', async () => {
    for (const value of ['Bearer', 'Bearer ', 'Bearer   ']) {
      const result = await guard.authenticate({ headers: { authorization: value } });
      expectCode(result, 'authorization_malformed');
      if (!result.ok) expect(result.error.wwwAuthenticate).toContain('error="invalid_request"');
    }
  });

  it('case 5: two Authorization headers are 400; with allowQueryToken, so are a header plus a query token', async () => {
    expectCode(
      await guard.authenticate({ headers: { authorization: [`Bearer ${token}`, `Bearer ${token}`] } }),
      'multiple_tokens',
    );
    const lax = guardWith({}, { allowQueryToken: true });
    expectCode(
      await lax.authenticate({ headers: { authorization: `Bearer ${token}` }, url: `/x?access_token=${token}` }),
      'multiple_tokens',
    );
    expectCode(
      await lax.authenticate({ headers: {}, url: `/x?access_token=${token}&access_token=${token}` }),
      'multiple_tokens',
    );
  });

  it('case 6: a token in the query is ignored unless allowQueryToken is set, however many are sent', async () => {
    expectCode(await guard.authenticate({ headers: {}, url: `/x?access_token=${token}` }), 'token_missing');
    const twice = await guard.authenticate({ headers: {}, url: '/x?access_token=a&access_token=b' });
    expectCode(twice, 'token_missing');
    if (!twice.ok) expect(twice.error.status).toBe(401);
    // Not a second token either: the header is the only credential this guard reads.
    expectOk(await guard.authenticate({ headers: { authorization: `Bearer ${token}` }, url: '/x?access_token=a' }));
    const lax = guardWith({}, { allowQueryToken: true });
    expectOk(await lax.authenticate({ headers: {}, url: `/x?access_token=${token}` }));
    // An empty query token is a malformed request, as an empty bearer token is.
    const empty = await lax.authenticate({ headers: {}, url: '/x?access_token=' });
    expectCode(empty, 'authorization_malformed');
    if (!empty.ok) expect(empty.error.status).toBe(400);
  });

  it('case 6: a query token, read or ignored, never reaches an event or an error', async () => {
    const events: GuardEvent[] = [];
    const watched = (options: Partial<GuardOptions>) =>
      guardWith({}, { ...options, onEvent: (event) => events.push(event) });
    const secretToken = makeToken({ claims: { sub: 'query-user', jti: 'query-jti' } });
    const expired = makeToken({ claims: { exp: START_MS / 1000 - 3600, jti: 'expired-jti' } });
    const results = [
      await watched({}).authenticate({ headers: {}, url: `/x?access_token=${secretToken}` }),
      await watched({ allowQueryToken: true }).authenticate({ headers: {}, url: `/x?access_token=${expired}` }),
      await watched({ allowQueryToken: true }).authenticate({ headers: {}, url: `/x?access_token=${secretToken}` }),
    ];
    expect(results.map((result) => (result.ok ? 'ok' : result.error.code))).toEqual([
      'token_missing',
      'token_expired',
      'ok',
    ]);
    expect(events.map((event) => event.type)).toEqual(['rejected', 'rejected', 'authenticated']);
    const logged = JSON.stringify(events);
    const refusals = results.flatMap((result) =>
      result.ok ? [] : [result.error.message, result.error.wwwAuthenticate, JSON.stringify(result.error.toProblem())],
    );
    for (const token of [secretToken, expired]) {
      for (const part of token.split('.')) {
        expect(logged).not.toContain(part);
        for (const text of refusals) expect(text).not.toContain(part);
      }
    }
    for (const claim of ['query-user', 'query-jti', 'expired-jti']) expect(logged).not.toContain(claim);
  });

  it('case 44: an oversized header or token is refused before parsing', async () => {
    const huge = 'a'.repeat(20_000);
    const result = await guard.authenticate({ headers: { authorization: `Bearer ${huge}` } });
    expectCode(result, 'token_too_large');
    if (!result.ok) expect(result.error.status).toBe(400);
    expectCode(await guard.verify(makeToken({ claims: { pad: 'x'.repeat(9000) } })), 'token_too_large');
    // The 1 MB payload through the query (allowQueryToken): refused on its length, never decoded.
    const lax = guardWith({}, { allowQueryToken: true });
    const payload = b64url({ iss: ISSUER, pad: 'x'.repeat(1024 * 1024) });
    const spy = vi.spyOn(Buffer, 'from');
    try {
      const fromQuery = await lax.authenticate({ headers: {}, url: `/x?access_token=h.${payload}.s` });
      expectCode(fromQuery, 'token_too_large');
      if (!fromQuery.ok) expect(fromQuery.error.status).toBe(400);
      expect(spy.mock.calls.some((call) => ['base64url', 'base64'].includes((call as unknown[])[1] as string))).toBe(
        false,
      );
    } finally {
      spy.mockRestore();
    }
  });

  it('case 44: the Authorization header itself is bounded, not only the token in it', async () => {
    const token = makeToken();
    const exact = guardWith({}, { limits: { maxTokenLength: token.length } });
    expectOk(await exact.authenticate(bearer(token)));
    // `Bearer ` and the token fit; padding the scheme with spaces makes the header too long to read at all.
    const padded = await exact.authenticate({ headers: { authorization: `Bearer${' '.repeat(20)}${token}` } });
    expectCode(padded, 'token_too_large');
    // One space more than `Bearer ` is already one character too many.
    expectCode(await exact.authenticate({ headers: { authorization: `Bearer  ${token}` } }), 'token_too_large');
  });
});

describe('algorithm and key cases', () => {
  it('case 7: alg none in any case is refused, with or without a signature', async () => {
    const guard = guardWith();
    for (const alg of ['none', 'None', 'NONE', 'nOnE']) {
      const header = b64url({ alg, typ: 'at+jwt' });
      const payload = makeToken().split('.')[1];
      expect((await guard.verify(`${header}.${payload}.`)).ok).toBe(false);
      expectCode(await guard.verify(`${header}.${payload}.c2ln`), 'algorithm_not_allowed');
    }
  });

  it('case 8: a null signature is refused', async () => {
    const [h, p] = makeToken().split('.');
    expectCode(await guardWith().verify(`${h}.${p}.`), 'token_malformed');
  });

  it('case 9: HS256 keyed with the RSA public key PEM is refused by an RS256 issuer', async () => {
    const forged = makeToken({ alg: 'HS256', key: keys.rsa.publicPem });
    expectCode(await rsaIssuer().verify(forged), 'algorithm_not_allowed');
    // Even an issuer that lists HS256 next to a public key cannot be built: no secret/public mix.
    expect(() => guardWith({ publicKeys: [keys.rsa.publicPem], algorithms: ['RS256', 'HS256'] })).toThrow(TypeError);
  });

  it('case 10: prefixed PEM or PKCS#1 PEM as HMAC key is refused, and cannot be configured as a secret', async () => {
    const pkcs1 = createPublicKey(keys.rsa.publicPem).export({ type: 'pkcs1', format: 'pem' }) as string;
    const guard = rsaIssuer({ publicKeys: [pkcs1] });
    expectOk(await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey })));
    for (const material of [
      `  ${keys.rsa.publicPem}`,
      `\u200b${keys.rsa.publicPem}`,
      `# c\n${keys.rsa.publicPem}`,
      pkcs1,
    ]) {
      expect((await guard.verify(makeToken({ alg: 'HS256', key: material }))).ok).toBe(false);
      expect(() => guardWith({ secret: material })).toThrow(TypeError);
    }
  });

  it('case 11: HS256 keyed with the public JWK JSON text is refused, and cannot be configured', async () => {
    const jwkText = JSON.stringify(keys.rsa.publicJwk);
    expectCode(await rsaIssuer().verify(makeToken({ alg: 'HS256', key: jwkText })), 'algorithm_not_allowed');
    expect(() => guardWith({ secret: jwkText })).toThrow(TypeError);
  });

  it('cases 10 and 11: key material in any encoding, text or bytes, cannot be configured as a secret', () => {
    const spki = createPublicKey(keys.rsa.publicPem).export({ type: 'spki', format: 'der' });
    const certificatePem = rootCertificates[0] as string;
    const certificate = new X509Certificate(certificatePem).raw;
    const privateDer = keys.ec.privateKey.export({ type: 'pkcs8', format: 'der' });
    const materials: Array<[string, string | Uint8Array]> = [
      ["readFileSync('idp.pem') without an encoding", Buffer.from(keys.rsa.publicPem)],
      ['the PEM as TextEncoder bytes', new TextEncoder().encode(keys.ec.publicPem)],
      ['a certificate PEM after a comment line', `# identity provider signing certificate\n${certificatePem}`],
      ['a certificate PEM as bytes', Buffer.from(certificatePem)],
      ['a JWKS keys array as JSON text', JSON.stringify([keys.rsa.publicJwk])],
      ['a JWKS as JSON bytes', Buffer.from(JSON.stringify({ keys: [keys.rsa.publicJwk] }))],
      ['base64 DER (SPKI)', spki.toString('base64')],
      [
        'base64 DER in 64-character lines (a PEM body without armour)',
        spki.toString('base64').replace(/(.{64})/g, '$1\n'),
      ],
      ['base64url DER', spki.toString('base64url')],
      ['hex DER', spki.toString('hex')],
      ['DER bytes (SPKI)', spki],
      ['DER bytes (PKCS#1)', createPublicKey(keys.rsa.publicPem).export({ type: 'pkcs1', format: 'der' })],
      ['a DER certificate', certificate],
      ['a base64 certificate (an x5c entry)', certificate.toString('base64')],
      ['a DER private key', privateDer],
      [
        'an OpenSSH public key',
        'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq0lVjBnbP7Oq5Q0pTz4V8bV3qCj5sM0y3y2S7M9Dk2 idp@example',
      ],
      [
        'an OpenSSH public key after a zero-width space',
        '\u200bssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq0lVjBnbP7Oq5Q0pTz4V8bV3qCj5sM0y3y2S7M9Dk2 idp@example',
      ],
      // Encoded once more: a Kubernetes Secret's base64 value used as it is, `xxd -p` of a file.
      ['a PEM in base64', Buffer.from(keys.rsa.publicPem).toString('base64')],
      ['a PEM in hex', Buffer.from(keys.ec.publicPem).toString('hex')],
      ['a JWK in base64url', Buffer.from(JSON.stringify(keys.rsa.publicJwk)).toString('base64url')],
      [
        'a JWKS in base64, as bytes',
        Buffer.from(Buffer.from(JSON.stringify({ keys: [keys.rsa.publicJwk] })).toString('base64')),
      ],
      // Copied with a trailing comma, or cut short: not JSON any more, still a JWK.
      ['a JWK with a trailing comma', `${JSON.stringify(keys.rsa.publicJwk).slice(0, -1)},}`],
      ['a JWK cut short', JSON.stringify(keys.rsa.publicJwk).slice(0, 200)],
    ];
    for (const [label, secret] of materials) {
      expect(() => guardWith({ secret }), label).toThrow(/key material/);
    }
    // Random secrets, in every encoding people keep them in, are never mistaken for a key; some start
    // with the DER SEQUENCE tag, so the DER parsers run on them too.
    for (let round = 0; round < 200; round++) {
      const bytes = randomBytes(round % 2 === 0 ? 32 : 64);
      if (round % 4 === 0) bytes[0] = 0x30;
      for (const secret of [bytes, bytes.toString('base64'), bytes.toString('base64url'), bytes.toString('hex')]) {
        expect(() => guardWith({ secret })).not.toThrow();
      }
    }
    expect(() => guardWith({ secret: SECRET })).not.toThrow();
    expect(() => guardWith({ secret: 'correct horse battery staple, and then some more words' })).not.toThrow();
  });

  it('case 12: HS256 against a JWKS-only issuer is refused without any JWKS fetch', async () => {
    const server = await startJwksServer({ kind: 'json', body: { keys: [{ ...keys.rsa.publicJwk, kid: 'r1' }] } });
    try {
      const guard = guardWith({ secret: undefined, jwksUri: server.url });
      const forged = makeToken({ alg: 'HS256', key: keys.rsa.publicPem, header: { kid: 'r1' } });
      expectCode(await guard.verify(forged), 'algorithm_not_allowed');
      expect(server.requests).toBe(0);
    } finally {
      await server.close();
    }
  });

  it('case 13: algorithms off the allowlist are refused (PS256 under RS256, ES384 under ES256)', async () => {
    expectCode(
      await rsaIssuer().verify(makeToken({ alg: 'PS256', key: keys.rsa.privateKey })),
      'algorithm_not_allowed',
    );
    const ec = guardWith({
      secret: undefined,
      publicKeys: [keys.ec.publicPem],
      algorithms: ['ES256'],
    });
    expectOk(await ec.verify(makeToken({ alg: 'ES256', key: keys.ec.privateKey })));
    expectCode(await ec.verify(makeToken({ alg: 'ES384', key: keys.ec384.privateKey })), 'algorithm_not_allowed');
    expect(() => guardWith({ secret: undefined, publicKeys: [keys.ec384.publicPem], algorithms: ['ES256'] })).toThrow(
      TypeError,
    );
  });

  it('case 14: a key is pinned to its JWK alg, or to the issuer alg, never to the header', async () => {
    const pinned = guardWith({
      secret: undefined,
      algorithms: ['RS256', 'PS256'],
      publicKeys: [{ ...keys.rsa.publicJwk, alg: 'RS256', kid: 'k' }],
    });
    expectCode(
      await pinned.verify(makeToken({ alg: 'PS256', key: keys.rsa.privateKey, header: { kid: 'k' } })),
      'algorithm_not_allowed',
    );
    const inferred = guardWith({
      secret: undefined,
      algorithms: ['RS256', 'PS256'],
      publicKeys: [{ ...keys.rsa.publicJwk, kid: 'k' }],
    });
    expectOk(await inferred.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid: 'k' } })));
    expectCode(
      await inferred.verify(makeToken({ alg: 'PS256', key: keys.rsa.privateKey, header: { kid: 'k' } })),
      'algorithm_not_allowed',
    );
  });

  it('case 15: keys with use "enc" or key_ops without verify are refused', async () => {
    for (const bad of [{ use: 'enc' }, { key_ops: ['encrypt'] }]) {
      expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.rsa.publicJwk, ...bad }] })).toThrow(
        TypeError,
      );
    }
    // Beside a usable key: a set left with no usable key is refused whole (keys_unavailable).
    const server = await startJwksServer({
      kind: 'json',
      body: {
        keys: [
          { ...keys.rsa.publicJwk, kid: 'e1', use: 'enc' },
          { ...keys.rsa2.publicJwk, kid: 's1', use: 'sig' },
        ],
      },
    });
    try {
      const guard = guardWith({ secret: undefined, jwksUri: server.url });
      expectCode(
        await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid: 'e1' } })),
        'key_unknown',
      );
    } finally {
      await server.close();
    }
  });

  it('RFC 8725 §3.4: an EC key whose point is off its curve is refused at configuration and in a fetched set', async () => {
    const jwk = { ...keys.ec.publicJwk, kid: 'c1' } as Record<string, string>;
    const y = Buffer.from(jwk.y as string, 'base64url');
    y[31] = (y[31] as number) ^ 1;
    const offCurve = { ...jwk, y: y.toString('base64url') };
    expect(() => guardWith({ secret: undefined, publicKeys: [offCurve] })).toThrow(/invalid-key/);
    // A P-256 point given as a P-384 key (a curve mix-up) is refused too.
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...jwk, crv: 'P-384' }] })).toThrow(TypeError);
    const server = await startJwksServer({ kind: 'json', body: { keys: [offCurve] } });
    try {
      const guard = guardWith({ secret: undefined, jwksUri: server.url });
      const token = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'c1' } });
      expectCode(await guard.verify(token), 'keys_unavailable');
    } finally {
      await server.close();
    }
  });

  it('advisory CVE-2026-35041 (RegExp claim options): audiences and issuers are exact strings only', async () => {
    const regexp = /api\.example/;
    for (const audience of [regexp, [regexp], [AUDIENCE, regexp]]) {
      // Refused with the message that names the option, not a "not iterable" from deep inside.
      expect(() => guardWith({}, { audience: audience as never })).toThrow(/an audience is required/);
    }
    expect(() => guardWith({ issuer: /id\.example/ })).toThrow(TypeError);
    // Any iterable of strings is a list, as before (a Set of audiences).
    expect(() => guardWith({}, { audience: new Set([AUDIENCE]) as never })).not.toThrow();
    // A string is compared whole, never as a pattern: '.' matches only '.'.
    const guard = guardWith({}, { audience: 'https://api.example' });
    expectCode(await guard.verify(makeToken({ claims: { aud: 'https://apixexample' } })), 'audience_invalid');
  });

  it('case 17: kid is only an exact key: traversal, injections, empty, huge and non-string kids fail', async () => {
    const guard = rsaIssuer({ publicKeys: [{ ...keys.rsa.publicJwk, kid: 'good' }] });
    for (const kid of ['../../../../dev/null', "' OR '1'='1", '$(sleep 5)', '', 'GOOD', 'good ']) {
      expectCode(
        await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid } })),
        'key_unknown',
      );
    }
    expectCode(
      await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid: 'k'.repeat(10_000) } })),
      'token_too_large',
    );
    for (const kid of [7, ['good'], { id: 'good' }]) {
      expectCode(
        await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, header: { kid } })),
        'token_malformed',
      );
    }
  });

  it('case 17: a kid over 1024 characters is refused even where the limits let its header through', async () => {
    // A configured key without a kid matches any kid: only the kid bound stands between such a key and a 10 KB kid.
    const roomy = guardWith({}, { limits: { maxHeaderLength: 40_000, maxTokenLength: 80_000 } });
    expectOk(await roomy.verify(makeToken({ header: { kid: 'k'.repeat(1024) } })));
    for (const kid of ['k'.repeat(1025), 'k'.repeat(10_000)]) {
      expectCode(await roomy.verify(makeToken({ header: { kid } })), 'token_malformed');
    }
  });

  it('a typ that is not a string is a malformed token, whatever the issuer accepts, never a throw', async () => {
    for (const guard of [guardWith(), guardWith({ typ: ['at+jwt', null] })]) {
      for (const typ of [7, ['at+jwt'], { t: 'at+jwt' }, null, true]) {
        expectCode(await guard.verify(makeToken({ header: { typ } })), 'token_malformed');
      }
    }
  });

  it('case 18: jku and x5u are refused and never fetched', async () => {
    const attacker = await startJwksServer({ kind: 'json', body: { keys: [keys.ec.publicJwk] } });
    try {
      const guard = guardWith();
      for (const name of ['jku', 'x5u']) {
        expectCode(await guard.verify(makeToken({ header: { [name]: attacker.url } })), 'header_unsupported');
      }
      expect(attacker.requests).toBe(0);
    } finally {
      await attacker.close();
    }
  });

  it('case 19: an embedded jwk is refused; an x5c chain is ignored, so a foreign signature fails', async () => {
    const guard = rsaIssuer();
    const embedded = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { jwk: keys.ec.publicJwk } });
    expectCode(await guard.verify(embedded), 'header_unsupported');
    const rsaEmbedded = makeToken({ alg: 'RS256', key: keys.rsa2.privateKey, header: { jwk: keys.rsa2.publicJwk } });
    expectCode(await guard.verify(rsaEmbedded), 'header_unsupported');
    const x5c = makeToken({ alg: 'RS256', key: keys.rsa2.privateKey, header: { x5c: ['MIIBfake'] } });
    expectCode(await guard.verify(x5c), 'signature_invalid');
  });

  it('case 20: crit with unknown names, registered claims or an empty list is refused', async () => {
    const guard = guardWith();
    for (const crit of [['x-unknown'], ['exp'], [], 'x-unknown']) {
      expectCode(await guard.verify(makeToken({ header: { crit, 'x-unknown': 1, exp: 1 } })), 'header_unsupported');
    }
    // Understood extensions pass (compact JWS has no unprotected header, so `crit` is always protected).
    const understood = guardWith({ crit: ['x-tenant'] });
    expectOk(await understood.verify(makeToken({ header: { crit: ['x-tenant'], 'x-tenant': 't1' } })));
    expectCode(await understood.verify(makeToken({ header: { crit: ['x-tenant'] } })), 'header_unsupported');
    // RFC 7515 §4.1.11: a list of distinct names, each present in the header itself (not inherited).
    const repeated = makeToken({ header: { crit: ['x-tenant', 'x-tenant'], 'x-tenant': 't1' } });
    expectCode(await understood.verify(repeated), 'header_unsupported');
    const inherited = guardWith({ crit: ['toString', ''] });
    expectCode(await inherited.verify(makeToken({ header: { crit: ['toString'] } })), 'header_unsupported');
    expectCode(await inherited.verify(makeToken({ header: { crit: [''], '': 1 } })), 'header_unsupported');
  });

  it('case 21: b64 false is refused', async () => {
    expectCode(await guardWith().verify(makeToken({ header: { b64: false, crit: ['b64'] } })), 'header_unsupported');
    // Refused by name, not only through crit: even a guard that lists b64 as understood, or a header without crit.
    for (const b64 of [false, true]) {
      expectCode(await guardWith().verify(makeToken({ header: { b64 } })), 'header_unsupported');
      const understood = guardWith({ crit: ['b64'] });
      expectCode(await understood.verify(makeToken({ header: { b64, crit: ['b64'] } })), 'header_unsupported');
    }
  });

  it('case 22: JWE, nested JWT and JSON serialization are refused without decryption', async () => {
    const guard = guardWith();
    expectCode(await guard.verify(`${b64url({ alg: 'dir', enc: 'A256GCM' })}.a.b.c.d`), 'token_malformed');
    // Every spelling of the JWT media type (RFC 7515 §4.1.10: case-insensitive, `application/` optional).
    for (const cty of ['JWT', 'jwt', 'application/jwt', 'Application/JWT']) {
      expectCode(await guard.verify(makeToken({ header: { cty } })), 'header_unsupported');
    }
    expectOk(await guard.verify(makeToken({ header: { cty: 'application/json' } })));
    const [h, p, s] = makeToken().split('.');
    expectCode(await guard.verify(JSON.stringify({ protected: h, payload: p, signature: s })), 'token_malformed');
  });

  it('case 23: PBES2 and zip headers are refused before any key work', async () => {
    const guard = guardWith();
    const pbes2 = `${b64url({ alg: 'PBES2-HS256+A128KW', enc: 'A128GCM', p2c: 2 ** 31, p2s: 'AAAA' })}.e.i.c.t`;
    expectCode(await guard.verify(pbes2), 'token_malformed');
    expectCode(await guard.verify(makeToken({ header: { zip: 'DEF' } })), 'header_unsupported');
    // Each JWE member is refused on its own in a compact JWS header.
    for (const name of ['enc', 'epk', 'p2s', 'p2c']) {
      expectCode(await guard.verify(makeToken({ header: { [name]: 'AAAA' } })), 'header_unsupported');
    }
    const compactPbes2 = makeToken({ header: { alg: 'PBES2-HS256+A128KW', p2c: 2 ** 31 } });
    expectCode(await guard.verify(compactPbes2), 'algorithm_not_allowed');
  });

  it('case 40: a key only verifies tokens of its own issuer', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [
        { issuer: 'https://a.example', publicKeys: [keys.rsa.publicPem], algorithms: ['RS256'] },
        { issuer: 'https://b.example', publicKeys: [keys.rsa2.publicPem], algorithms: ['RS256'] },
      ],
    });
    expectOk(
      await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, claims: { iss: 'https://a.example' } })),
    );
    expectCode(
      await guard.verify(makeToken({ alg: 'RS256', key: keys.rsa.privateKey, claims: { iss: 'https://b.example' } })),
      'signature_invalid',
    );
  });

  it('case 41: malformed ES256 signatures are refused (zeros, too large, DER, wrong length)', async () => {
    const guard = guardWith({
      secret: undefined,
      publicKeys: [keys.ec.publicPem],
      algorithms: ['ES256'],
    });
    const valid = makeToken({ alg: 'ES256', key: keys.ec.privateKey });
    expectOk(await guard.verify(valid));
    const [h, p] = valid.split('.');
    const n = Buffer.from('ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551', 'hex');
    const signatures = [
      Buffer.alloc(64),
      Buffer.concat([n, n]),
      Buffer.concat([
        Buffer.from([0x30, 0x44, 0x02, 0x20]),
        Buffer.alloc(32, 1),
        Buffer.from([0x02, 0x20]),
        Buffer.alloc(32, 1),
      ]),
      Buffer.alloc(63, 1),
    ];
    for (const signature of signatures) {
      expectCode(await guard.verify(`${h}.${p}.${signature.toString('base64url')}`), 'signature_invalid');
    }
  });

  it('case 42: weak RSA keys (1024 bits, e=1) are refused at configuration', () => {
    expect(() => guardWith({ secret: undefined, publicKeys: [keys.rsa1024.publicPem] })).toThrow(/weak-key/);
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.rsa.publicJwk, e: 'AQ' }] })).toThrow(
      /weak-key/,
    );
    // An even exponent is no RSA key; one over 64 bits is not accepted either.
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.rsa.publicJwk, e: 'AQAA' }] })).toThrow(
      /weak-key/,
    );
    const hugeExponent = Buffer.from([1, 0, 0, 0, 0, 0, 0, 0, 1]).toString('base64url');
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.rsa.publicJwk, e: hugeExponent }] })).toThrow(
      /invalid-key/,
    );
    // Leading zero bytes do not make a modulus longer: a 1024-bit one padded to 257 bytes is still 1024 bits.
    const short = Buffer.from(keys.rsa1024.publicJwk.n as string, 'base64url');
    const padded = Buffer.concat([Buffer.alloc(257 - short.length), short]).toString('base64url');
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.rsa1024.publicJwk, n: padded }] })).toThrow(
      /weak-key/,
    );
    // An empty kid names nothing.
    expect(() => guardWith({ secret: undefined, publicKeys: [{ ...keys.ec.publicJwk, kid: '' }] })).toThrow(
      /invalid-kid/,
    );
  });

  it('case 42: a modulus with the ROCA fingerprint (CVE-2017-15361) is refused; one prime off it is not flagged', () => {
    const primes = [
      3n,
      5n,
      7n,
      11n,
      13n,
      17n,
      19n,
      23n,
      29n,
      31n,
      37n,
      41n,
      43n,
      47n,
      53n,
      59n,
      61n,
      67n,
      71n,
      73n,
      79n,
      83n,
      89n,
      97n,
      101n,
      103n,
      107n,
      109n,
      113n,
      127n,
      131n,
      137n,
      139n,
      149n,
      151n,
      157n,
      163n,
      167n,
    ];
    const product = primes.reduce((a, b) => a * b, 1n);
    // n ≡ 65537 (mod p) for every prime p: 65537 mod p lies in the subgroup 65537 generates, as an
    // Infineon modulus does. An even k keeps n odd; the top bit makes it 2048 bits.
    const k = (((1n << 2047n) / product) | 1n) + 1n;
    const roca = 65537n + k * product;
    expect(roca.toString(2)).toHaveLength(2048);
    expect(isRocaModulus(roca)).toBe(true);
    const n = Buffer.from(roca.toString(16), 'hex').toString('base64url');
    expect(() => guardWith({ secret: undefined, publicKeys: [{ kty: 'RSA', n, e: 'AQAB' }] })).toThrow(/weak-key/);
    // Off the subgroup for the last prime only: not the fingerprint.
    const last = 167n;
    let offByOne: bigint | undefined;
    for (let m = 1n; m < last && offByOne === undefined; m++) {
      const candidate = roca + 2n * m * (product / last);
      if (!isRocaModulus(candidate)) offByOne = candidate;
    }
    expect(offByOne).toBeDefined();
    const healthy = BigInt(`0x${Buffer.from(keys.rsa.publicJwk.n as string, 'base64url').toString('hex')}`);
    expect(isRocaModulus(healthy)).toBe(false);
  });

  it('advisory CVE-2022-23539: a PEM key of a type no JWS algorithm uses (DSA, DH) is a TypeError naming publicKeys', () => {
    const pems = [
      generateKeyPairSync('dsa', { modulusLength: 1024, divisorLength: 160 }).publicKey,
      // Node's types list no 'dh' overload; the runtime takes it.
      (generateKeyPairSync as (type: string, options: object) => { publicKey: KeyObject })('dh', { group: 'modp14' })
        .publicKey,
    ].map((key) => key.export({ type: 'spki', format: 'pem' }) as string);
    for (const pem of pems) {
      // A TypeError at construction, as every bad option is, with words about the option, not Node's
      // "Unsupported JWK Key Type." from deep inside.
      expect(() => guardWith({ secret: undefined, publicKeys: [pem] })).toThrow(TypeError);
      expect(() => guardWith({ secret: undefined, publicKeys: [pem] })).toThrow(/publicKeys/);
    }
  });

  it('case 43: empty, short or guessable HMAC secrets are refused at startup', () => {
    for (const secret of ['', 'secret', 'x'.repeat(31), new Uint8Array(16), 'x'.repeat(32), new Uint8Array(32)]) {
      expect(() => guardWith({ secret })).toThrow(TypeError);
    }
    expect(() => guardWith({ secret: 'x'.repeat(47), algorithms: ['HS384'] })).toThrow(TypeError);
    expect(() => guardWith({ secret: 'x'.repeat(31) + 'y' })).not.toThrow();
  });

  it('case 56: HMAC is compared by WebCrypto verify (constant time), never by string comparison', async () => {
    const spy = vi.spyOn(crypto.subtle, 'verify');
    try {
      const guard = guardWith();
      const token = makeToken();
      expectOk(await guard.verify(token));
      const calls = spy.mock.calls.length;
      expect(calls).toBeGreaterThan(0);
      expect(JSON.stringify(spy.mock.calls[0]?.[0])).toContain('HMAC');
      const tampered = `${token.slice(0, -2)}${token.endsWith('A') ? 'B' : 'A'}${token.slice(-1)}`;
      expect((await guard.verify(tampered)).ok).toBe(false);
    } finally {
      spy.mockRestore();
    }
  });
});

describe('parsing cases', () => {
  const guard = guardWith();
  const signed = (header: string, payload: string) => signSegments(header, payload, 'HS256', SECRET);
  const goodHeader = b64url({ alg: 'HS256', typ: 'at+jwt' });
  const goodPayload = makeToken().split('.')[1] as string;

  it('case 24: wrong segment counts and empty segments are refused', async () => {
    const [h, p, s] = makeToken().split('.');
    for (const token of [`${h}.${p}`, `${h}.${p}.${s}.${s}`, `${h}.${p}.${s}.`, `.${p}.${s}`, signed(goodHeader, '')]) {
      expect((await guard.verify(token)).ok).toBe(false);
    }
    expectCode(await guard.verify(`${h}.${p}`), 'token_malformed');
    expectCode(await guard.verify(signed(goodHeader, '')), 'token_malformed');
  });

  it('case 25: non-canonical base64url is refused even when the signature matches', async () => {
    const variants = [
      signed(`${goodHeader}=`, goodPayload),
      signed(goodHeader.replace(/_/g, '/').replace(/-/g, '+') + '+', goodPayload),
      signed(` ${goodHeader}`, goodPayload),
      signed(goodHeader, `${goodPayload.slice(0, 10)}\r\n${goodPayload.slice(10)}`),
    ];
    for (const token of variants) expectCode(await guard.verify(token), 'token_malformed');
    // Set bits in the unused tail: same bytes, different text.
    const tail = goodPayload.length % 4 === 2 || goodPayload.length % 4 === 3;
    if (tail) {
      const last = goodPayload.at(-1) as string;
      const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
      const bumped = goodPayload.slice(0, -1) + alphabet[alphabet.indexOf(last) + 1];
      expectCode(await guard.verify(signed(goodHeader, bumped)), 'token_malformed');
    }
  });

  it('case 26: header or payload that is not a JSON object is refused', async () => {
    for (const value of ['[]', '"x"', '1', 'null']) {
      expectCode(await guard.verify(signed(b64url(value), goodPayload)), 'token_malformed');
      expectCode(await guard.verify(signed(goodHeader, b64url(value))), 'token_malformed');
    }
  });

  it('case 27: duplicate member names and __proto__ are refused', async () => {
    const payload = JSON.parse(Buffer.from(goodPayload, 'base64url').toString()) as Record<string, unknown>;
    const text = JSON.stringify(payload);
    expectCode(await guard.verify(signed(goodHeader, b64url(text.replace('{', '{"sub":"admin",')))), 'token_malformed');
    expectCode(
      await guard.verify(signed(goodHeader, b64url(text.replace('{', '{"__proto__":{"admin":true},')))),
      'token_malformed',
    );
    expectCode(
      await guard.verify(signed(b64url('{"alg":"HS256","alg":"none","typ":"at+jwt"}'), goodPayload)),
      'token_malformed',
    );
  });

  it('case 28: invalid UTF-8 in header or payload is refused', async () => {
    const text = Buffer.from(goodPayload, 'base64url').toString();
    const broken = Buffer.concat([
      Buffer.from(text.slice(0, -1) + ',"x":"'),
      Buffer.from([0xc3, 0x28]),
      Buffer.from('"}'),
    ]);
    expectCode(await guard.verify(signed(goodHeader, broken.toString('base64url'))), 'token_malformed');
    const brokenHeader = Buffer.concat([
      Buffer.from('{"alg":"HS256","typ":"at+jwt","x":"'),
      Buffer.from([0xff]),
      Buffer.from('"}'),
    ]);
    expectCode(await guard.verify(signed(brokenHeader.toString('base64url'), goodPayload)), 'token_malformed');
    // A byte order mark is not JSON (RFC 8259 §8.1): it is kept by the decoder, so the parser refuses it.
    const bom = Buffer.from([0xef, 0xbb, 0xbf]);
    const bomHeader = Buffer.concat([bom, Buffer.from('{"alg":"HS256","typ":"at+jwt"}')]).toString('base64url');
    expectCode(await guard.verify(signed(bomHeader, goodPayload)), 'token_malformed');
    const bomPayload = Buffer.concat([bom, Buffer.from(goodPayload, 'base64url')]).toString('base64url');
    expectCode(await guard.verify(signed(goodHeader, bomPayload)), 'token_malformed');
  });

  it('case 45: a payload nested 10,000 levels deep fails fast without a stack overflow', async () => {
    const deep = `{"iss":"${ISSUER}","x":${'['.repeat(10_000)}${']'.repeat(10_000)}}`;
    const result = await createGuard({
      audience: AUDIENCE,
      limits: { maxTokenLength: 100_000 },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    }).verify(signed(goodHeader, b64url(deep)));
    expectCode(result, 'token_malformed');
  });
});

describe('claim cases', () => {
  const nowSeconds = START_MS / 1000;

  it('case 29: exp missing is refused', async () => {
    expectCode(await guardWith().verify(makeToken({ omit: ['exp'] })), 'claim_invalid');
  });

  it('case 30: exp equal to now is expired, now+1 is not (tolerance 0); default tolerance is 5 s', async () => {
    const strict = guardWith({ clockTolerance: 0 });
    expectCode(await strict.verify(makeToken({ claims: { exp: nowSeconds } })), 'token_expired');
    expectOk(await strict.verify(makeToken({ claims: { exp: nowSeconds + 1 } })));
    const lenient = guardWith();
    expectOk(await lenient.verify(makeToken({ claims: { exp: nowSeconds - 4 } })));
    expectCode(await lenient.verify(makeToken({ claims: { exp: nowSeconds - 5 - 1 } })), 'token_expired');
  });

  it('case 31: non-number, non-finite, negative and fractional exp are refused', async () => {
    const guard = guardWith();
    for (const exp of ['9999999999', true, null, -1, nowSeconds + 100.5]) {
      expectCode(await guard.verify(makeToken({ claims: { exp } })), 'claim_invalid');
    }
    const raw = `{"iss":"${ISSUER}","sub":"u","aud":"${AUDIENCE}","exp":1e999}`;
    expectCode(await guard.verify(makeToken({ rawPayload: raw })), 'claim_invalid');
  });

  it('case 32: nbf beyond the tolerance, or not a number, is refused', async () => {
    const guard = guardWith();
    expectCode(await guard.verify(makeToken({ claims: { nbf: nowSeconds + 60 } })), 'token_not_yet_valid');
    expectCode(await guard.verify(makeToken({ claims: { nbf: 'soon' } })), 'claim_invalid');
    expectOk(await guard.verify(makeToken({ claims: { nbf: nowSeconds + 3 } })));
  });

  it('case 33: iat in the future beyond the tolerance is refused (no maxTokenAge needed)', async () => {
    expectCode(await guardWith().verify(makeToken({ claims: { iat: nowSeconds + 60 } })), 'token_issued_in_future');
  });

  it('case 33 at its boundary: an iat the tolerance ahead passes, one second more is refused', async () => {
    // The default tolerance (5 s), then none: `iat` may be as far ahead as the tolerance, not a second more.
    const lenient = guardWith();
    expectOk(await lenient.verify(makeToken({ claims: { iat: nowSeconds + 5 } })));
    expectCode(await lenient.verify(makeToken({ claims: { iat: nowSeconds + 6 } })), 'token_issued_in_future');
    const strict = guardWith({ clockTolerance: 0 });
    expectOk(await strict.verify(makeToken({ claims: { iat: nowSeconds } })));
    expectCode(await strict.verify(makeToken({ claims: { iat: nowSeconds + 1 } })), 'token_issued_in_future');
  });

  it('advisory CVE-2026-44459: an iat or nbf that is not a finite non-negative integer is refused, not skipped', async () => {
    const guard = guardWith();
    for (const value of ['1800000000', true, null, -1, nowSeconds - 0.5, [nowSeconds], { n: nowSeconds }]) {
      expectCode(await guard.verify(makeToken({ claims: { iat: value } })), 'claim_invalid');
      expectCode(await guard.verify(makeToken({ claims: { nbf: value } })), 'claim_invalid');
    }
    for (const name of ['iat', 'nbf']) {
      const raw = `{"iss":"${ISSUER}","sub":"u","aud":"${AUDIENCE}","exp":${nowSeconds + 60},"${name}":1e999}`;
      expectCode(await guard.verify(makeToken({ rawPayload: raw })), 'claim_invalid');
    }
  });

  it('case 34: iat older than maxTokenAge, or a lifetime over maxLifetime, is refused', async () => {
    expectCode(
      await guardWith({ maxTokenAge: 60 }).verify(makeToken({ claims: { iat: nowSeconds - 120 } })),
      'token_too_old',
    );
    expectCode(await guardWith({ maxTokenAge: 60 }).verify(makeToken({ omit: ['iat'] })), 'claim_invalid');
    expectCode(
      await guardWith({ maxLifetime: 120 }).verify(makeToken({ claims: { exp: nowSeconds + 3600 } })),
      'lifetime_too_long',
    );
  });

  it('cases 32 and 34 at their boundaries: nbf = now, an age of exactly maxTokenAge and a lifetime of exactly maxLifetime pass', async () => {
    const strict = guardWith({ clockTolerance: 0 });
    expectOk(await strict.verify(makeToken({ claims: { nbf: nowSeconds } })));
    expectCode(await strict.verify(makeToken({ claims: { nbf: nowSeconds + 1 } })), 'token_not_yet_valid');

    const young = guardWith({ clockTolerance: 0, maxTokenAge: 60 });
    expectOk(await young.verify(makeToken({ claims: { iat: nowSeconds - 60 } })));
    expectCode(await young.verify(makeToken({ claims: { iat: nowSeconds - 61 } })), 'token_too_old');
    // The tolerance applies on top of maxTokenAge.
    const lenient = guardWith({ maxTokenAge: 60 });
    expectOk(await lenient.verify(makeToken({ claims: { iat: nowSeconds - 65 } })));
    expectCode(await lenient.verify(makeToken({ claims: { iat: nowSeconds - 66 } })), 'token_too_old');

    const short = guardWith({ maxLifetime: 120 });
    expectOk(await short.verify(makeToken({ claims: { iat: nowSeconds, exp: nowSeconds + 120 } })));
    expectCode(
      await short.verify(makeToken({ claims: { iat: nowSeconds, exp: nowSeconds + 121 } })),
      'lifetime_too_long',
    );
    // The lifetime runs from iat when there is one, even with a later nbf.
    expectCode(
      await short.verify(makeToken({ claims: { iat: nowSeconds - 100, nbf: nowSeconds, exp: nowSeconds + 100 } })),
      'lifetime_too_long',
    );
  });

  it('case 35: iss wrong, missing, with a trailing slash or in another case is refused', async () => {
    const guard = guardWith();
    for (const iss of ['https://evil.example', `${ISSUER}/`, ISSUER.toUpperCase(), 42]) {
      expectCode(await guard.verify(makeToken({ claims: { iss } })), 'issuer_unknown');
    }
    expectCode(await guard.verify(makeToken({ omit: ['iss'] })), 'issuer_unknown');
  });

  it('case 36: aud missing, wrong, without us, with a non-string member or empty is refused', async () => {
    const guard = guardWith();
    expectCode(await guard.verify(makeToken({ omit: ['aud'] })), 'claim_invalid');
    expectCode(await guard.verify(makeToken({ claims: { aud: 'https://other.example' } })), 'audience_invalid');
    expectCode(await guard.verify(makeToken({ claims: { aud: ['a', 'b'] } })), 'audience_invalid');
    expectCode(await guard.verify(makeToken({ claims: { aud: [AUDIENCE, 7] } })), 'claim_invalid');
    expectCode(await guard.verify(makeToken({ claims: { aud: '' } })), 'claim_invalid');
    expectOk(await guard.verify(makeToken({ claims: { aud: ['x', AUDIENCE] } })));
    // An empty list is no audience at all: malformed, not merely someone else's.
    expectCode(await guard.verify(makeToken({ claims: { aud: [] } })), 'claim_invalid');
  });

  it('case 36 (RFC 8725 §3.9): an audience is compared whole, never as a prefix, in another case or with a slash', async () => {
    const guard = guardWith();
    const near = [
      `${AUDIENCE}.evil.example`,
      `${AUDIENCE}/`,
      `${AUDIENCE}/other`,
      `${AUDIENCE}x`,
      AUDIENCE.slice(0, -1),
      AUDIENCE.toUpperCase(),
      ` ${AUDIENCE}`,
    ];
    for (const aud of near) {
      expectCode(await guard.verify(makeToken({ claims: { aud } })), 'audience_invalid');
      expectCode(await guard.verify(makeToken({ claims: { aud: ['x', aud] } })), 'audience_invalid');
    }
    expectOk(await guard.verify(makeToken({ claims: { aud: AUDIENCE } })));
  });

  it('case 37: sub missing or not a string, client_id missing in a strict profile, are refused', async () => {
    expectCode(await guardWith().verify(makeToken({ omit: ['sub'] })), 'claim_invalid');
    expectCode(await guardWith().verify(makeToken({ claims: { sub: 12 } })), 'claim_invalid');
    const strict = guardWith({ requiredClaims: ['client_id', 'jti', 'iat'] });
    expectCode(await strict.verify(makeToken({ omit: ['client_id'] })), 'claim_invalid');
    expectOk(await strict.verify(makeToken()));
  });

  it('case 37: an empty sub, and a jti or client_id that is not a string, or a scope that is no string or list of strings, are refused', async () => {
    const guard = guardWith();
    expectCode(await guard.verify(makeToken({ claims: { sub: '' } })), 'claim_invalid');
    for (const name of ['jti', 'client_id']) {
      for (const value of [7, ['a'], { id: 'a' }, true]) {
        expectCode(await guard.verify(makeToken({ claims: { [name]: value } })), 'claim_invalid');
      }
    }
    // `scope` is one space-delimited string (RFC 9068 §2.2.3), or a list of strings as Duende
    // IdentityServer writes it (principal.test.ts); anything else is refused.
    for (const scope of [[7], 7, null, { 0: 'orders:read' }]) {
      expectCode(await guard.verify(makeToken({ claims: { scope } })), 'claim_invalid');
    }
  });

  it('case 37: a sub that is whitespace only or holds a control or bidirectional control character names nobody and is refused', async () => {
    // It keys the idempotency scope and the audit lines: ' ' or '\t' would be one shared "nobody", and a
    // line break or NUL in it would forge or cut a log line.
    const guard = guardWith();
    const blank = [' ', '   ', '\t', '\n', '\r\n', '\u00a0', '\u2028', '\u3000', '\ufeff'];
    const control = ['user\n1', 'user\u00001', 'user\r', '\u001b[31muser', 'user\u007f', 'user\u0085', 'user\u009f'];
    // Bidirectional controls reorder how a log line reads ("Trojan Source"): 'admin\u202e1resu' shows as 'adminuser1'.
    const bidi = ['admin\u202e1resu', 'a\u202ab', 'a\u202db', 'a\u2066b', 'a\u2069', '\u200fa', 'a\u200e', 'a\u061cb'];
    for (const sub of [...blank, ...control, ...bidi]) {
      expectCode(await guard.verify(makeToken({ claims: { sub, jti: `j-${JSON.stringify(sub)}` } })), 'claim_invalid');
    }
    // Names with spaces inside, non-ASCII letters and invisible-but-not-control characters stay accepted:
    // issuers use them (Kubernetes `system:serviceaccount:ns:name`, e-mail-like and display-like subjects).
    for (const sub of [
      'user 1',
      'système',
      'system:serviceaccount:ns:name',
      'a',
      'ü\u200db',
      'a\u200cb',
      'עברית',
      'العربية',
    ]) {
      expectOk(await guard.verify(makeToken({ claims: { sub, jti: `j-${sub}` } })));
    }
  });

  it('case 37: an empty jti or client_id is refused as an empty sub is, required or not', async () => {
    // Present but naming nothing: `requiredClaims` asked for a client and a token id (RFC 9068 §2.2), and
    // an empty one would satisfy it; behind the gateway it would travel on as the caller's client.
    const strict = guardWith({ requiredClaims: ['client_id', 'jti'] });
    for (const guard of [guardWith(), strict]) {
      expectCode(await guard.verify(makeToken({ claims: { jti: '' } })), 'claim_invalid');
      expectCode(await guard.verify(makeToken({ claims: { client_id: '' } })), 'claim_invalid');
      expectCode(await guard.verify(makeToken({ claims: { client_id: '', azp: 'app' } })), 'claim_invalid');
    }
    expectOk(await strict.verify(makeToken({ claims: { jti: 'j', client_id: 'c' } })));
  });

  it('case 37: a required claim sent as an empty string is missing, whatever its name; other values count', async () => {
    const guard = guardWith({ requiredClaims: ['tenant'] });
    expectCode(await guard.verify(makeToken({ claims: { tenant: '' } })), 'claim_invalid');
    expectCode(await guard.verify(makeToken()), 'claim_invalid');
    for (const tenant of ['t1', 0, false, [], {}]) expectOk(await guard.verify(makeToken({ claims: { tenant } })));
  });

  it('case 38: ID tokens (typ JWT, or nonce) and internal tokens are refused as access tokens', async () => {
    const guard = guardWith();
    expectCode(await guard.verify(makeToken({ header: { typ: 'JWT' } })), 'type_invalid');
    expectCode(await guard.verify(makeToken({ header: { typ: undefined } })), 'type_invalid');
    const lax = guardWith({ typ: ['at+jwt', 'jwt', null, 'internal+jwt'] });
    expectOk(await lax.verify(makeToken({ header: { typ: 'JWT' } })));
    expectCode(
      await lax.verify(makeToken({ header: { typ: 'JWT' }, claims: { nonce: 'n', aud: AUDIENCE } })),
      'type_invalid',
    );
    expectCode(await lax.verify(makeToken({ header: { typ: 'internal+jwt' } })), 'type_invalid');
  });

  it('case 39: typ application/AT+JWT is accepted', async () => {
    expectOk(await guardWith().verify(makeToken({ header: { typ: 'application/AT+JWT' } })));
  });

  it('case 52 (bearer part): a sender-constrained token (cnf) presented as Bearer is refused', async () => {
    expectCode(await guardWith().verify(makeToken({ claims: { cnf: { jkt: 'abc' } } })), 'token_bound');
  });

  it('RFC 8705: a certificate-bound token (cnf x5t#S256) presented as Bearer is refused, DPoP or not', async () => {
    const bound = makeToken({ claims: { cnf: { 'x5t#S256': 'bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2' } } });
    for (const guard of [guardWith(), guardWith({}, { dpop: {} })]) {
      const result = await guard.authenticate(bearer(bound));
      expectCode(result, 'token_bound');
      if (!result.ok) expect(result.error.status).toBe(401);
    }
  });

  it('case 55: an expired token has no accept path', async () => {
    const result = await guardWith().authenticate(bearer(makeToken({ claims: { exp: nowSeconds - 3600 } })));
    expectCode(result, 'token_expired');
    if (!result.ok) expect(result.error.status).toBe(401);
  });
});

describe('cache cases', () => {
  it('a token with a character outside the JWS compact alphabet is malformed before any cache lookup', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const token = makeToken();
    expectOk(await guard.verify(token));
    for (const variant of [`${token} `, `${token} jkt`, `${token}=`, `${token}\n`, `${token.replace('.', '+')}`, '']) {
      expectCode(await guard.verify(variant), 'token_malformed');
    }
    expect(guard.stats().cacheHits).toBe(0);
  });

  it('case 46: a flood of distinct valid tokens gets the right principal each time; near-copies never hit', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      cache: { maxEntries: 500 },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const tokens = Array.from({ length: 3000 }, (_, i) => makeToken({ claims: { sub: `user-${i}`, jti: `j-${i}` } }));
    const first = await Promise.all(tokens.map((token) => guard.verify(token)));
    first.forEach((result, i) => {
      expect(result.ok && result.principal.sub).toBe(`user-${i}`);
    });
    const order = tokens.map((_, i) => (i * 7919) % tokens.length);
    for (const i of order.slice(0, 1500)) {
      const again = await guard.verify(tokens[i] as string);
      expect(again.ok && again.principal.sub).toBe(`user-${i}`);
    }
    expect(guard.stats().cacheHits).toBeGreaterThan(0);
    // A cached token with one signature character changed is verified, not served from the cache.
    const cached = tokens[2999] as string;
    expect((await guard.verify(cached)).ok).toBe(true);
    const altered = await guard.verify(`${cached.slice(0, -1)}${cached.endsWith('A') ? 'E' : 'A'}`);
    expect(altered.ok ? 'ok' : altered.error.code).toBe('signature_invalid');
    const resigned = `${cached.slice(0, -2)}${cached.at(-2) === 'A' ? 'B' : 'A'}${cached.at(-1)}`;
    expectCode(await guard.verify(resigned), 'signature_invalid');
  });
});
