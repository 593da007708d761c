import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  defaultIdentityHeaders,
  forwardHeaders,
  joinHeaderValues,
  type Principal,
  principalFromClaims,
  requireAuthentication,
  requireScopes,
  stripIdentityHeaders,
  verifyInternalToken,
  withoutHopByHop,
} from '../src/index.js';
import { startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET, START_MS } from './support/tokens.js';

const GATEWAY = 'https://gateway.example';

async function edgePrincipal(claims: Record<string, unknown> = {}): Promise<Principal> {
  const guard = createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  const result = await guard.verify(
    makeToken({ claims: { roles: ['admin', 'ops'], email: 'a@example.com', tenant: 't1', ...claims } }),
  );
  if (!result.ok) throw new Error(result.error.code);
  return result.principal;
}

describe('internal token', () => {
  it('mints a short-lived EdDSA token for one upstream and yields the same principal downstream', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now, claims: ['email'] });
    const principal = await edgePrincipal();
    const token = await issuer.mint(principal, { audience: 'orders' });
    const [header, payload] = token
      .split('.')
      .slice(0, 2)
      .map((part) => JSON.parse(Buffer.from(part as string, 'base64url').toString()));
    expect(header).toMatchObject({ alg: 'EdDSA', typ: 'internal+jwt', kid: issuer.currentKid });
    expect(payload.exp - payload.iat).toBe(60);
    expect(payload).toMatchObject({
      iss: GATEWAY,
      aud: 'orders',
      sub: 'user-1',
      client_id: 'app-1',
      jti: 'jti-1',
      email: 'a@example.com',
    });
    expect(payload.tenant).toBeUndefined();
    // Reserved claims asked for as extra claims are never copied from the edge token: an edge `nbf`,
    // `nonce` or `cnf` would make the internal token fail downstream, and an edge `roles` not read as
    // roles (here the roles claim is `groups`) would become roles there.
    const greedy = createInternalTokenIssuer({
      issuer: GATEWAY,
      now: clock.now,
      claims: ['email', 'roles', 'nbf', 'nonce', 'cnf', 'orig_iss'],
    });
    const edge = principalFromClaims(
      {
        sub: 'user-1',
        iss: ISSUER,
        aud: AUDIENCE,
        email: 'a@example.com',
        roles: ['admin'],
        nbf: clock.seconds() + 3600,
        nonce: 'n-1',
        cnf: { jkt: 'abc' },
        orig_iss: 'https://forged.example',
      },
      { rolesClaim: 'groups' },
    );
    const minted = await greedy.mint(edge, { audience: 'orders' });
    const claims = JSON.parse(Buffer.from(minted.split('.')[1] as string, 'base64url').toString());
    expect(claims.email).toBe('a@example.com');
    for (const name of ['roles', 'nbf', 'nonce', 'cnf']) expect(claims[name], name).toBeUndefined();
    expect(claims.orig_iss).toBe(ISSUER);

    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: issuer.jwks(),
      now: clock.now,
    });
    const result = await verifier.authenticate({ headers: { 'idem-internal-token': token } });
    if (!result.ok) throw new Error(result.error.code);
    expect(result.principal.sub).toBe(principal.sub);
    expect(result.principal.iss).toBe(ISSUER);
    expect(result.principal.aud).toEqual([AUDIENCE]);
    expect([...result.principal.scope]).toEqual([...principal.scope]);
    expect([...result.principal.roles]).toEqual(['admin', 'ops']);
    expect(result.principal.clientId).toBe('app-1');
    expect(result.principal.jti).toBe('jti-1');
  });

  it('an internal token whose sub is blank or holds a control character is refused downstream, as at the edge', async () => {
    // A principal built by hand (the edge guard refuses such a token) minted anyway: the service behind
    // the gateway must not take ' ' as its caller either.
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    const options = { issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks(), now: clock.now };
    for (const sub of [' ', '\t', 'user\n1']) {
      const principal = principalFromClaims({ sub, iss: ISSUER, aud: AUDIENCE });
      const result = await verifyInternalToken(await issuer.mint(principal, { audience: 'orders' }), options);
      expect(result.ok ? 'ok' : result.error.code, JSON.stringify(sub)).toBe('claim_invalid');
    }
  });

  it("a future auth_time behind the gateway gets the verifier's clockTolerance in authorize()", async () => {
    // The principal names the edge issuer, which the verifier does not list: its own tolerance applies.
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now, claims: ['auth_time'] });
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: issuer.jwks(),
      now: clock.now,
      clockTolerance: 30,
    });
    const rule = requireAuthentication({ maxAge: 300 });
    const decide = async (authTime: number) => {
      const edge = await edgePrincipal({ auth_time: authTime });
      const result = await verifier.verify(await issuer.mint(edge, { audience: 'orders' }));
      if (!result.ok) throw new Error(result.error.code);
      return verifier.authorize(result.principal, [rule]).ok;
    };
    expect(await decide(clock.seconds() + 30)).toBe(true);
    expect(await decide(clock.seconds() + 31)).toBe(false);
  });

  it('checks audience, expiry, issuer and type, and nothing of the edge profile', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    const token = await issuer.mint(await edgePrincipal(), { audience: 'orders' });
    const options = { issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks(), now: clock.now };
    expect((await verifyInternalToken(token, options)).ok).toBe(true);
    const wrongAudience = await verifyInternalToken(token, { ...options, audience: 'billing' });
    expect(wrongAudience.ok ? 'ok' : wrongAudience.error.code).toBe('audience_invalid');
    const wrongIssuer = await verifyInternalToken(token, { ...options, issuer: 'https://other.example' });
    expect(wrongIssuer.ok ? 'ok' : wrongIssuer.error.code).toBe('issuer_unknown');
    const otherGateway = createInternalTokenIssuer({ issuer: GATEWAY });
    const foreign = await verifyInternalToken(token, { ...options, jwks: otherGateway.jwks() });
    expect(foreign.ok ? 'ok' : foreign.error.code).toBe('key_unknown');
    clock.advance(66);
    const expired = await verifyInternalToken(token, options);
    expect(expired.ok ? 'ok' : expired.error.code).toBe('token_expired');
  });

  // Was a defect: with `jwksUri`, each one-shot call built a verifier of its own and fetched the JWKS
  // again, so a service verifying per request sent one JWKS request per request to the gateway.
  it('refuses jwksUri in the one-shot form, pointing to createInternalVerifier, which fetches once', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    const server = await startJwksServer({
      kind: 'json',
      body: issuer.jwks(),
      headers: { 'cache-control': 'max-age=300' },
    });
    try {
      const token = await issuer.mint(await edgePrincipal(), { audience: 'orders' });
      const options = { issuer: GATEWAY, audience: 'orders', jwksUri: server.url, now: clock.now };
      for (let i = 0; i < 3; i++) {
        expect(() => verifyInternalToken(token, options)).toThrow(TypeError);
        expect(() => verifyInternalToken(token, options)).toThrow(/jwksUri.*createInternalVerifier/);
        const { jwksUri: _, ...withoutUri } = options;
        expect(() => verifyInternalToken(token, { ...withoutUri, jwksOptions: { cooldown: 1 } })).toThrow(
          /jwksOptions.*createInternalVerifier/,
        );
      }
      expect(server.requests).toBe(0);
      const verifier = createInternalVerifier({ ...options, cache: false });
      for (let i = 0; i < 3; i++) expect((await verifier.verify(token)).ok).toBe(true);
      expect(server.requests).toBe(1);
    } finally {
      await server.close();
    }
  });

  it('an edge token never passes as an internal token, and an internal token never passes at the edge', async () => {
    const edgeToken = makeToken({ alg: 'HS256' });
    const verifier = createInternalVerifier({
      issuer: ISSUER,
      audience: AUDIENCE,
      jwks: createInternalTokenIssuer({ issuer: ISSUER }).jwks(),
    });
    const asInternal = await verifier.verify(edgeToken);
    expect(asInternal.ok ? 'ok' : asInternal.error.code).toBe('type_invalid');

    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const internal = await issuer.mint(await edgePrincipal(), { audience: AUDIENCE });
    const edge = createGuard({
      audience: AUDIENCE,
      issuers: [{ issuer: GATEWAY, jwks: issuer.jwks(), algorithms: ['EdDSA'], typ: ['at+jwt', 'internal+jwt'] }],
    });
    const atEdge = await edge.verify(internal);
    expect(atEdge.ok ? 'ok' : atEdge.error.code).toBe('type_invalid');
  });

  it('rotates: the new key is published at once and signs after the delay; older keys stay while their tokens live', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 2, now: clock.now });
    const principal = await edgePrincipal();
    const kidOf = (token: string) => JSON.parse(Buffer.from(token.split('.')[0] as string, 'base64url').toString()).kid;
    const before = await issuer.mint(principal, { audience: 'orders' });
    const firstKid = issuer.currentKid;
    const secondKid = issuer.rotate();
    expect(secondKid).not.toBe(firstKid);
    // Published first, signing only after the rotation delay (60 s by default).
    expect(issuer.jwks().keys.map((key) => key.kid)).toEqual([secondKid, firstKid]);
    expect(issuer.currentKid).toBe(firstKid);
    expect(kidOf(await issuer.mint(principal, { audience: 'orders' }))).toBe(firstKid);
    clock.advance(60);
    expect(issuer.currentKid).toBe(secondKid);
    const after = await issuer.mint(principal, { audience: 'orders' });
    expect(kidOf(after)).toBe(secondKid);
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: issuer.jwks(),
      now: clock.now,
    });
    expect((await verifier.verify(after)).ok).toBe(true);
    // An explicit `delay: 0` switches at once (a compromised key). The older keys' tokens may still be
    // live, so they stay published beyond maxPublishedKeys ...
    const es256 = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
    issuer.rotate({ kid: 'es', privateKey: es256 }, { delay: 0 });
    expect(issuer.currentKid).toBe('es');
    expect(issuer.jwks().keys.map((key) => key.kid)).toEqual(['es', secondKid, firstKid]);
    // ... until their last tokens (signed at t=60 at the latest, 60 s ttl, 60 s of verifier tolerance)
    // are dead. Then they are withdrawn, maxPublishedKeys or not: whatever a thief signs with them fails.
    clock.advance(119);
    expect(issuer.jwks().keys.map((key) => key.kid)).toEqual(['es', secondKid, firstKid]);
    clock.advance(1);
    expect(issuer.jwks().keys.map((key) => key.kid)).toEqual(['es']);
    const later = createInternalVerifier({ issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks(), now: clock.now });
    const old = await later.verify(before);
    expect(old.ok ? 'ok' : old.error.code).toBe('key_unknown');
    expect((await later.verify(await issuer.mint(principal, { audience: 'orders' }))).ok).toBe(true);
  });

  it('rotate() never causes key_unknown at a service fetching the gateway JWKS, even rotating in quick succession', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now, maxPublishedKeys: 1 });
    const server = await startJwksServer({ kind: 'json', body: issuer.jwks() });
    try {
      const verifier = createInternalVerifier({
        issuer: GATEWAY,
        audience: 'orders',
        jwksUri: server.url,
        jwksOptions: { cooldown: 30, defaultTtl: 600 },
        now: clock.now,
        cache: false,
      });
      const principal = await edgePrincipal();
      const refused: string[] = [];
      let minted: string[] = [];
      for (let t = 0; t <= 400; t += 5) {
        // The gateway rotates at t=5, and three more times 10 s apart later on.
        if (t === 5 || t === 200 || t === 210 || t === 220) issuer.rotate();
        server.set({ kind: 'json', body: issuer.jwks() });
        minted = [...minted.slice(-11), await issuer.mint(principal, { audience: 'orders' })];
        // Every token minted in the last minute (its whole life) still verifies.
        for (const token of minted) {
          const result = await verifier.verify(token);
          if (!result.ok && result.error.code !== 'token_expired') refused.push(`t=${t}: ${result.error.code}`);
        }
        clock.advance(5);
      }
      expect(refused).toEqual([]);
      expect(server.requests).toBeGreaterThan(1);
    } finally {
      await server.close();
    }
  });

  it('refuses a bad rotation delay', () => {
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, rotationDelay: -1 })).toThrow(TypeError);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, rotationDelay: Number.NaN })).toThrow(TypeError);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, rotationDelay: 3601 })).toThrow(TypeError);
    expect(createInternalTokenIssuer({ issuer: GATEWAY, rotationDelay: 3600 }).issuer).toBe(GATEWAY);
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    expect(() => issuer.rotate(undefined, { delay: 7200 })).toThrow(TypeError);
    expect(() =>
      issuer.rotate({ kid: issuer.currentKid, privateKey: generateKeyPairSync('ed25519').privateKey }),
    ).toThrow(/duplicate/);
  });

  it('a service configured with the gateway public key as PEM (no kid) verifies its tokens, which name one', async () => {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, keys: [{ privateKey }] });
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      keys: [publicKey.export({ type: 'spki', format: 'pem' }) as string],
    });
    const token = await issuer.mint(await edgePrincipal(), { audience: 'orders' });
    const result = await verifier.verify(token);
    expect(result.ok ? 'ok' : result.error.code).toBe('ok');
  });

  it('refuses bad issuer options at construction', () => {
    expect(() => createInternalTokenIssuer({ issuer: '' })).toThrow(TypeError);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, ttl: 0 })).toThrow(TypeError);
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, keys: [{ privateKey: rsa }] })).toThrow(TypeError);
  });

  it('mint: iat is the current whole second (rounded down), exp iat + ttl; an empty audience is refused', async () => {
    const clock = manualClock(START_MS + 999);
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now, ttl: 30 });
    const principal = await edgePrincipal();
    const token = await issuer.mint(principal, { audience: 'orders' });
    const payload = JSON.parse(Buffer.from(token.split('.')[1] as string, 'base64url').toString());
    expect(payload.iat).toBe(START_MS / 1000);
    expect(payload.exp).toBe(START_MS / 1000 + 30);
    await expect(issuer.mint(principal, { audience: '' })).rejects.toThrow(TypeError);
  });

  it('the verifier reads its header in whatever case it was configured (Node lower-cases header names)', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    const token = await issuer.mint(await edgePrincipal(), { audience: 'orders' });
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: issuer.jwks(),
      header: 'X-GW-Token',
      now: clock.now,
    });
    const result = await verifier.authenticate({ headers: { 'x-gw-token': token } });
    expect(result.ok ? 'ok' : result.error.code).toBe('ok');
    // Surrounding whitespace is not part of the token.
    const spaced = await verifier.authenticate({ headers: { 'x-gw-token': ` ${token}\t` } });
    expect(spaced.ok ? 'ok' : spaced.error.code).toBe('ok');
  });

  it('the internal header must appear once', async () => {
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: createInternalTokenIssuer({ issuer: GATEWAY }).jwks(),
    });
    const none = await verifier.authenticate({ headers: {} });
    expect(none.ok ? 'ok' : none.error.code).toBe('token_missing');
    const two = await verifier.authenticate({ headers: { 'idem-internal-token': ['a.b.c', 'a.b.c'] } });
    expect(two.ok ? 'ok' : two.error.code).toBe('multiple_tokens');
    const blank = await verifier.authenticate({ headers: { 'idem-internal-token': '   ' } });
    expect(blank.ok ? 'ok' : blank.error.code).toBe('authorization_malformed');
  });
});

describe('internal signing key ring (publication windows)', () => {
  const kids = (issuer: { jwks(): { keys: Array<{ kid?: string }> } }) => issuer.jwks().keys.map((key) => key.kid);

  it('keeps an older configured key published for one token lifetime plus 60 s of verifier tolerance, then drops it', () => {
    const clock = manualClock();
    const current = generateKeyPairSync('ed25519').privateKey;
    const previous = generateKeyPairSync('ed25519').privateKey;
    const issuer = createInternalTokenIssuer({
      issuer: GATEWAY,
      keys: [
        { kid: 'current', privateKey: current },
        { kid: 'previous', privateKey: previous },
      ],
      maxPublishedKeys: 1,
      now: clock.now,
    });
    // A previous run of the gateway signed with `previous` until just now: its tokens live 60 s, and a
    // verifier may accept them for 60 s more.
    expect(kids(issuer)).toEqual(['current', 'previous']);
    expect(issuer.currentKid).toBe('current');
    clock.advance(119);
    expect(kids(issuer)).toEqual(['current', 'previous']);
    clock.advance(1);
    expect(kids(issuer)).toEqual(['current']);
  });

  it('keeps a superseded key published until its last token is past the largest verifier tolerance (60 s)', () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 1, now: clock.now });
    const first = issuer.currentKid;
    const second = issuer.rotate(undefined, { delay: 0 });
    // The last token `first` signed was minted just before the switch: it lives 60 s, and a verifier
    // with the largest clock tolerance accepts it for 60 s more.
    clock.advance(119);
    expect(kids(issuer)).toEqual([second, first]);
    clock.advance(1);
    expect(kids(issuer)).toEqual([second]);
  });

  it('a key overtaken before it ever signs is not kept beyond maxPublishedKeys', () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 1, now: clock.now });
    const first = issuer.currentKid;
    // Two rotations at the same instant with the same delay: the first new key never signs.
    const never = issuer.rotate();
    const next = issuer.rotate();
    expect(kids(issuer)).toEqual([next, first]);
    expect(kids(issuer)).not.toContain(never);
    // A slow rotation overtaken by an immediate one: the current key is superseded by the immediate one,
    // so it goes one lifetime plus tolerance after that, not after the slow one's start.
    const clock2 = manualClock();
    const issuer2 = createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 2, now: clock2.now });
    const original = issuer2.currentKid;
    const slow = issuer2.rotate(undefined, { delay: 3600 });
    expect(kids(issuer2)).toEqual([slow, original]);
    // The immediate one withdraws the keys before it: the slow one never signed, and goes at once.
    const immediate = issuer2.rotate(undefined, { delay: 0 });
    expect(kids(issuer2)).toEqual([immediate, original]);
    clock2.advance(119);
    expect(kids(issuer2)).toEqual([immediate, original]);
    clock2.advance(1);
    expect(kids(issuer2)).toEqual([immediate]);
  });

  it('bounds ttl to 1..3600 s and maxPublishedKeys to at least 1', () => {
    expect(createInternalTokenIssuer({ issuer: GATEWAY, ttl: 3600 }).issuer).toBe(GATEWAY);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, ttl: 3601 })).toThrow(TypeError);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, ttl: 1.5 })).toThrow(TypeError);
    expect(createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 1 }).jwks().keys).toHaveLength(1);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, maxPublishedKeys: 0 })).toThrow(TypeError);
  });

  it('refuses a duplicate configured kid, a public key, and curves other than Ed25519 and P-256', () => {
    const ed = generateKeyPairSync('ed25519');
    expect(() =>
      createInternalTokenIssuer({
        issuer: GATEWAY,
        keys: [
          { kid: 'gw', privateKey: ed.privateKey },
          { kid: 'gw', privateKey: generateKeyPairSync('ed25519').privateKey },
        ],
      }),
    ).toThrow(/duplicate/);
    // The same key twice without a kid: both default to the same thumbprint.
    expect(() =>
      createInternalTokenIssuer({
        issuer: GATEWAY,
        keys: [{ privateKey: ed.privateKey }, { privateKey: ed.privateKey }],
      }),
    ).toThrow(/duplicate/);
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, keys: [{ privateKey: ed.publicKey }] })).toThrow(
      /private/,
    );
    const p384 = generateKeyPairSync('ec', { namedCurve: 'P-384' }).privateKey;
    expect(() => createInternalTokenIssuer({ issuer: GATEWAY, keys: [{ privateKey: p384 }] })).toThrow(TypeError);
    const p256 = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
    expect(createInternalTokenIssuer({ issuer: GATEWAY, keys: [{ privateKey: p256 }] }).jwks().keys[0]?.alg).toBe(
      'ES256',
    );
  });
});

describe('header stripping and forwarding (case 47)', () => {
  const spoofed = {
    'x-user-id': 'admin',
    x_user_id: 'admin',
    'X-USER-ID': 'admin',
    'x-user-roles': ['admin', 'root'],
    X_Auth_Request_Email: 'boss@example.com',
    'x-internal-token': 'forged',
    'idem-internal-token': 'forged',
    IDEM_INTERNAL_TOKEN: 'forged',
    'x-forwarded-user': 'admin',
    'x-remote-user': 'admin',
    // What authenticating proxies write for the services behind them (Authelia, Kong, IAP, Azure, ALB, Cloudflare).
    'Remote-User': 'admin',
    'Remote-Groups': 'admins',
    'x-remote-groups': 'admins',
    'X-Consumer-Username': 'admin',
    'x-credential-identifier': 'admin',
    'x-authenticated-userid': 'admin',
    'X-Goog-Authenticated-User-Email': 'accounts.google.com:boss@example.com',
    'x-goog-iap-jwt-assertion': 'forged',
    'x-endpoint-api-userinfo': 'e30',
    'X-MS-CLIENT-PRINCIPAL': 'e30',
    'X-MS-CLIENT-PRINCIPAL-NAME': 'boss@example.com',
    'x-amzn-oidc-identity': 'admin',
    'Cf-Access-Authenticated-User-Email': 'boss@example.com',
    // The roots of the families and their hyphenless spellings, and more proxies' names.
    'X-User': 'admin',
    'X-UserId': 'admin',
    'X-Userinfo': 'e30',
    'X-Auth': 'admin',
    'X-Authorization': 'Bearer forged',
    'X-Internal': '1',
    'X-Access-Token': 'forged',
    'X-ID-Token': 'forged',
    'X-Pomerium-Claim-Email': 'boss@example.com',
    'X-Pomerium-Jwt-Assertion': 'forged',
    'X-JWT-Payload': 'e30',
    'X-JWT-Assertion': 'forged',
    authorization: 'Bearer abc',
    accept: 'application/json',
    'x-request-id': 'r1',
  };

  it('removes every identity family by namespace, whatever the case, underscores or duplicates', () => {
    const stripped = stripIdentityHeaders(spoofed);
    expect(stripped).toEqual({ authorization: 'Bearer abc', accept: 'application/json', 'x-request-id': 'r1' });
    expect(defaultIdentityHeaders).toContain('x-user*');
    // Near names outside every family stay.
    expect(stripIdentityHeaders({ 'x-usage': '1', 'x-jw': '1', 'x-idempotent': '1' })).toEqual({
      'x-usage': '1',
      'x-jw': '1',
      'x-idempotent': '1',
    });
    expect(stripIdentityHeaders({ 'x-tenant': 't', X_Tenant_Id: 'u' }, { extra: ['x-tenant*'] })).toEqual({});
  });

  it('forwardHeaders drops the bearer, strips spoofed headers and adds a fresh internal token', async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const headers = await forwardHeaders(spoofed, principal, { issuer, audience: 'orders' });
    expect(Object.keys(headers).sort()).toEqual(['accept', 'idem-internal-token', 'x-request-id']);
    const verifier = createInternalVerifier({ issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks() });
    const result = await verifier.authenticate({ headers });
    expect(result.ok && result.principal.sub).toBe('user-1');
    const kept = await forwardHeaders(spoofed, principal, {
      issuer,
      audience: 'orders',
      keepAuthorization: true,
      header: 'x-gw-token',
    });
    expect(kept.authorization).toBe('Bearer abc');
    expect(kept['x-gw-token']).toBeTypeOf('string');
    expect(kept['idem-internal-token']).toBeUndefined();
    // A header map not from Node may spell the name in any case; the bearer is dropped all the same.
    const spelled = { Authorization: 'Bearer abc', AUTHORIZATION: 'Bearer def', accept: 'application/json' };
    const dropped = await forwardHeaders(spelled, principal, { issuer, audience: 'orders' });
    expect(Object.keys(dropped).sort()).toEqual(['accept', 'idem-internal-token']);
    // The configured token header is stripped in every spelling before the fresh token is set.
    const forged = { 'X-GW-Token': 'forged', x_gw_token: 'forged', accept: 'application/json' };
    const own = await forwardHeaders(forged, principal, { issuer, audience: 'orders', header: 'X-GW-Token' });
    expect(Object.keys(own).sort()).toEqual(['accept', 'x-gw-token']);
    expect(own['x-gw-token']).not.toBe('forged');
  });

  // Was a defect (found from the reference app): the verifier took a realm but no resourceMetadata, so
  // the 403 a service behind the gateway answers lacked the resource_metadata of the gateway's own 401s.
  it('puts its realm and resourceMetadata into the challenges of its refusals, the 403 included', async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const metadata = 'https://api.example/.well-known/oauth-protected-resource';
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: issuer.jwks(),
      realm: 'orders',
      resourceMetadata: metadata,
    });
    const missing = await verifier.authenticate({ headers: {} });
    expect(!missing.ok && missing.error.wwwAuthenticate).toBe(`Bearer realm="orders", resource_metadata="${metadata}"`);
    const token = await issuer.mint(await edgePrincipal({ scope: 'orders:read' }), { audience: 'orders' });
    const result = await verifier.authenticate({ headers: { 'idem-internal-token': token } });
    if (!result.ok) throw new Error(result.error.code);
    const decision = verifier.authorize(result.principal, [requireScopes('orders:write')]);
    expect(!decision.ok && decision.error.wwwAuthenticate).toBe(
      `Bearer realm="orders", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:write", resource_metadata="${metadata}"`,
    );
    // A value that would break the header is refused at construction, as the guard refuses it.
    expect(() =>
      createInternalVerifier({ issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks(), resourceMetadata: 'a"b' }),
    ).toThrow(TypeError);
  });

  // Was a defect: behind an HTTP/2 server (Fastify's `http2: true`), Node's request headers carry the
  // pseudo-headers, which were passed on: fetch refused the name `:method` and the gateway answered 500.
  it('forwardHeaders and withoutHopByHop drop HTTP/2 pseudo-headers, which fetch refuses', async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const h2 = {
      ':method': 'POST',
      ':path': '/orders',
      ':authority': 'api.example',
      ':scheme': 'https',
      accept: 'application/json',
    };
    const headers = await forwardHeaders(h2, principal, { issuer, audience: 'orders' });
    expect(Object.keys(headers).sort()).toEqual(['accept', 'idem-internal-token']);
    expect(() => new Headers(joinHeaderValues(headers))).not.toThrow();
    expect(withoutHopByHop({ ':status': '201', 'content-type': 'application/json' })).toEqual({
      'content-type': 'application/json',
    });
  });

  // A client-sent X-Forwarded-For/Host/Proto reaches an upstream that trusts its proxy (the gateway) as if
  // the gateway had written it; the family also carries identity (X-Forwarded-Email, -Groups, -Client-Cert).
  const proxied = {
    forwarded: 'for=203.0.113.7;proto=https;host=evil.example',
    'x-forwarded-for': '203.0.113.7',
    'X-Forwarded-Host': 'evil.example',
    'x-forwarded-proto': 'https',
    'x-forwarded-port': '443',
    'x-forwarded-prefix': '/api',
    x_forwarded_for: '10.0.0.1',
    'x-forwarded-email': 'boss@example.com',
    'x-forwarded-groups': 'admins',
    'x-forwarded-client-cert': 'Hash=abc;Subject="CN=admin"',
    'x-forwarded-user': 'admin',
    // The single-value spellings of the client address that proxies and CDNs write.
    'X-Real-IP': '203.0.113.8',
    'true-client-ip': '203.0.113.9',
    'cf-connecting-ip': '203.0.113.10',
    'x-client-ip': '203.0.113.11',
    accept: 'application/json',
  };

  it('strips Forwarded and X-Forwarded-* by default; keepForwarded keeps only the proxy headers, as sent', async () => {
    expect(stripIdentityHeaders(proxied)).toEqual({ accept: 'application/json' });
    expect(defaultIdentityHeaders).toEqual(
      expect.arrayContaining(['forwarded', 'x-forwarded-*', 'x-real-ip', 'true-client-ip', 'cf-connecting-ip']),
    );
    const kept = {
      forwarded: proxied.forwarded,
      'x-forwarded-for': '203.0.113.7',
      'X-Forwarded-Host': 'evil.example',
      'x-forwarded-proto': 'https',
      'x-forwarded-port': '443',
      'x-forwarded-prefix': '/api',
      'X-Real-IP': '203.0.113.8',
      'true-client-ip': '203.0.113.9',
      'cf-connecting-ip': '203.0.113.10',
      'x-client-ip': '203.0.113.11',
      accept: 'application/json',
    };
    expect(stripIdentityHeaders(proxied, { keepForwarded: true })).toEqual(kept);
    // A header the caller asks to strip by name goes, whatever keepForwarded keeps.
    const { 'X-Real-IP': _named, ...keptButNamed } = kept;
    expect(stripIdentityHeaders(proxied, { keepForwarded: true, extra: ['x-real-ip'] })).toEqual(keptButNamed);
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const forwarded = await forwardHeaders(proxied, principal, { issuer, audience: 'orders' });
    expect(Object.keys(forwarded).sort()).toEqual(['accept', 'idem-internal-token']);
    const trusted = await forwardHeaders(proxied, principal, { issuer, audience: 'orders', keepForwarded: true });
    expect(Object.keys(trusted).sort()).toEqual([...Object.keys(kept), 'idem-internal-token'].sort());
  });

  it('drops hop-by-hop headers, those Connection names, the credentials meant for the gateway as a proxy, and host', async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const incoming = {
      Host: 'gateway.example',
      connection: 'keep-alive, X-Hop',
      'x-hop': 'only for this connection',
      'Keep-Alive': 'timeout=5',
      'transfer-encoding': 'chunked',
      te: 'trailers',
      trailer: 'x-checksum',
      upgrade: 'websocket',
      'proxy-connection': 'keep-alive',
      'Proxy-Authorization': 'Basic Z2F0ZXdheTpzZWNyZXQ=',
      'content-type': 'application/json',
      'content-length': '17',
      'idempotency-key': '"k-1"',
    };
    const forwarded = await forwardHeaders(incoming, principal, { issuer, audience: 'orders' });
    expect(Object.keys(forwarded).sort()).toEqual([
      'content-length',
      'content-type',
      'idem-internal-token',
      'idempotency-key',
    ]);
    expect(incoming.connection).toBe('keep-alive, X-Hop');
  });

  it('keeps Idempotency-Key when Connection names it, and drops Expect, which the gateway answered', async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const incoming = {
      Connection: 'Idempotency-Key, X-Hop, content-type',
      'Idempotency-Key': '"k-1"',
      'x-hop': 'only for this connection',
      'content-type': 'application/json',
      Expect: '100-continue',
    };
    const forwarded = await forwardHeaders(incoming, principal, { issuer, audience: 'orders' });
    expect(Object.keys(forwarded).sort()).toEqual(['Idempotency-Key', 'idem-internal-token']);
    // A response's Connection still takes what it names, whatever the name.
    expect(withoutHopByHop({ connection: 'idempotency-key', 'idempotency-key': '"k-1"', expect: 'x' })).toEqual({
      expect: 'x',
    });
  });

  it('joinHeaderValues joins what is still an array with ", " and drops undefined values', () => {
    expect(joinHeaderValues({ accept: ['a', 'b'], 'content-length': 17, host: 'x', gone: undefined })).toEqual({
      accept: 'a, b',
      'content-length': '17',
      host: 'x',
    });
  });

  it("withoutHopByHop leaves an upstream's response headers without its connection's own, and the input as it was", () => {
    const upstream = {
      Connection: 'keep-alive, X-Upstream-Hop',
      'x-upstream-hop': 'about the gateway-to-upstream connection',
      'Keep-Alive': 'timeout=5',
      'transfer-encoding': 'chunked',
      trailer: 'x-checksum',
      upgrade: 'h2c',
      'content-type': 'application/json',
      etag: 'W/"1"',
      'set-cookie': ['a=1', 'b=2'],
    };
    expect(withoutHopByHop(upstream)).toEqual({
      'content-type': 'application/json',
      etag: 'W/"1"',
      'set-cookie': ['a=1', 'b=2'],
    });
    expect(upstream.Connection).toBe('keep-alive, X-Upstream-Hop');
    expect(upstream['Keep-Alive']).toBe('timeout=5');
  });

  it("guard.forwardHeaders mints with the guard's internalTokens, and refuses without an issuer", async () => {
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY });
    const principal = await edgePrincipal();
    const withIssuer = createGuard({
      audience: AUDIENCE,
      internalTokens: issuer,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const headers = await withIssuer.forwardHeaders({ authorization: 'Bearer x', x_user_id: 'admin' }, principal, {
      audience: 'orders',
    });
    expect(Object.keys(headers)).toEqual(['idem-internal-token']);
    const verifier = createInternalVerifier({ issuer: GATEWAY, audience: 'orders', jwks: issuer.jwks() });
    expect((await verifier.authenticate({ headers })).ok).toBe(true);
    const without = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    await expect(without.forwardHeaders({}, principal, { audience: 'orders' })).rejects.toThrow(TypeError);
  });
});
