import { createHash, randomUUID } from 'node:crypto';
import { request } from 'node:http';
import { calculateJwkThumbprint } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  type Guard,
  type InternalTokenIssuer,
} from '../../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './tokens.js';

/**
 * One HTTP scenario table for the guard glue of every framework (research section 2, the HTTP-level
 * rows). Each adapter test starts a real server on an ephemeral port with these routes:
 *
 * - `ALL /protected`           guard → 200 `{ sub, scope }`
 * - `GET /write`               guard, authorize(requireScopes('orders:write')) → 200 `{ ok: true }`
 * - `GET /admin`               guard, authorize(requireRoles('admin')) → 200 `{ ok: true }`
 * - `GET /forward`             guard → 200 with the JSON of forwardHeaders(..., { audience: 'orders' }) (the guard has internalTokens)
 * - `GET /internal`            internalAuth(verifier) → 200 `{ sub, iss, scope }`
 * - `GET /internal-write`      internalAuth(verifier), authorize(requireScopes('orders:write')) → 200
 * - `GET /authorize-only`      authorize(requireScopes('orders:read')) without a guard → must be 401
 * - `ALL /dpop`                guard(dpopGuard) → 200 `{ sub }` (DPoP allowed, `htu` from the Host header)
 * - `ALL /optional`            guard(shopGuard, { optional: true }) → 200 `{ sub }`, `sub` null when anonymous
 * - `GET /optional-read`       the same, then authorize(requireScopes('orders:read')) → 200 `{ ok: true }`
 * - `POST /optional-charge`    the same, then the framework's idempotency middleware on a memory store
 *                              (default scope) → 201 `{ sub, n }`, `n` counting the handler's runs
 * - `POST /optional-scoped-charge` the same, the idempotency middleware with `scope: () => 'everyone'`
 *                              → 201 `{ sub, n }` (`sub` null when anonymous)
 * - `ALL /optional-dpop`       guard(dpopGuard, { optional: true }) → 200 `{ sub }`, `sub` null when anonymous
 * - `ALL /dpop-nonce`          guard(nonceGuard) → 200 `{ sub }` (DPoP with server nonces, `lifetime` 60 s)
 *
 * Every handler calls `hit(route)`, so the table proves refused requests never reach one.
 */
export interface AuthAppDeps {
  guard: Guard;
  /**
   * The guard of the optional routes: a realm and RFC 9728 metadata of its own, so that an answer
   * built without it (a default challenge) shows.
   */
  shopGuard: Guard;
  dpopGuard: Guard;
  nonceGuard: Guard;
  verifier: Guard;
  internalIssuer: InternalTokenIssuer;
  hit: (route: string) => void;
}

export interface AuthApp {
  url: string;
  close(): Promise<void>;
}

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

function send(url: string, method: string, path: string, headers: Array<[string, string]> = []): Promise<Reply> {
  return new Promise((resolve, reject) => {
    // A raw header list (it can repeat a name); it then has to carry Host itself.
    const flat = [['host', new URL(url).host], ...headers].flat();
    const req = request(
      `${url}${path}`,
      { method, agent: false, headers: flat as unknown as Record<string, string> },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
        );
      },
    );
    req.on('error', reject);
    req.end();
  });
}

const SHOP_METADATA = 'https://api.example/.well-known/oauth-protected-resource';
const SHOP_CHALLENGE = `Bearer realm="shop", resource_metadata="${SHOP_METADATA}"`;

export function describeAuthGlue(framework: string, start: (deps: AuthAppDeps) => Promise<AuthApp>): void {
  describe(`${framework} guard glue (HTTP-level cases)`, () => {
    const clock = manualClock();
    const hits: string[] = [];
    const internalIssuer = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      internalTokens: internalIssuer,
      // Bounds the default tokens (iat now, a 300 s lifetime) stay well within; set so every
      // claim-time code can be sent over HTTP below.
      maxTokenAge: 3600,
      maxLifetime: 86_400,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const verifier = createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders',
      jwks: internalIssuer.jwks(),
      now: clock.now,
    });
    const shopGuard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      realm: 'shop',
      resourceMetadata: SHOP_METADATA,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const dpopGuard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      dpop: {},
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const nonceGuard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      dpop: { nonce: { secret: 'the glue test nonce secret, 32 bytes+', lifetime: 60 } },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    let app: AuthApp;
    beforeAll(async () => {
      app = await start({
        guard,
        shopGuard,
        dpopGuard,
        nonceGuard,
        verifier,
        internalIssuer,
        hit: (route) => hits.push(route),
      });
    });
    afterAll(async () => {
      await app.close();
    });

    const token = makeToken();
    const call = (method: string, path: string, headers: Array<[string, string]> = []) =>
      send(app.url, method, path, headers);
    const expectProblem = (reply: Reply, status: number, code: string) => {
      expect(reply.status).toBe(status);
      expect(reply.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(reply.headers['cache-control']).toBe('no-store');
      const body = JSON.parse(reply.body) as Record<string, unknown>;
      expect(body).toMatchObject({ status, code, retryable: false });
      expect(body.type).toBe(`https://idem.dev/problems/${code.replaceAll('_', '-')}`);
    };
    const refusedWithoutHandler = async (promise: Promise<Reply>, status: number, code: string) => {
      const before = hits.length;
      const reply = await promise;
      expectProblem(reply, status, code);
      expect(hits.length).toBe(before);
      return reply;
    };

    it('a valid token reaches the handler with the principal attached', async () => {
      const reply = await call('GET', '/protected', [['authorization', `Bearer ${token}`]]);
      expect(reply.status).toBe(200);
      expect(JSON.parse(reply.body)).toEqual({ sub: 'user-1', scope: ['orders:read', 'profile'] });
    });

    it('case 1: no token is 401 with a bare challenge', async () => {
      const reply = await refusedWithoutHandler(call('GET', '/protected'), 401, 'token_missing');
      expect(reply.headers['www-authenticate']).toBe('Bearer realm="api"');
    });

    it('case 2: other schemes are treated as no bearer token', async () => {
      for (const scheme of ['Basic', 'Token', 'DPoP']) {
        const reply = await refusedWithoutHandler(
          call('GET', '/protected', [['authorization', `${scheme} ${token}`]]),
          401,
          'token_missing',
        );
        expect(reply.headers['www-authenticate']).toBe('Bearer realm="api"');
      }
    });

    it('case 3: lower-case scheme and extra spaces pass; tab and trailing junk are 400', async () => {
      expect((await call('GET', '/protected', [['authorization', `bearer  ${token}`]])).status).toBe(200);
      for (const value of [`Bearer\t${token}`, `Bearer ${token} junk`]) {
        const reply = await refusedWithoutHandler(
          call('GET', '/protected', [['authorization', value]]),
          400,
          'authorization_malformed',
        );
        expect(reply.headers['www-authenticate']).toContain('error="invalid_request"');
      }
    });

    it('case 4: an empty bearer is 400 invalid_request', async () => {
      await refusedWithoutHandler(
        call('GET', '/protected', [['authorization', 'Bearer ']]),
        400,
        'authorization_malformed',
      );
    });

    it('case 5: two Authorization headers are 400', async () => {
      await refusedWithoutHandler(
        call('GET', '/protected', [
          ['authorization', `Bearer ${token}`],
          ['authorization', `Bearer ${token}`],
        ]),
        400,
        'multiple_tokens',
      );
    });

    it('case 6: query tokens are ignored without allowQueryToken (401 without error; never a second token)', async () => {
      await refusedWithoutHandler(call('GET', `/protected?access_token=${token}`), 401, 'token_missing');
      await refusedWithoutHandler(call('GET', '/protected?access_token=a&access_token=b'), 401, 'token_missing');
      const reply = await call('GET', `/protected?access_token=${token}`, [['authorization', `Bearer ${token}`]]);
      expect(reply.status).toBe(200);
    });

    it('an invalid token is 401 invalid_token with a fixed description', async () => {
      const reply = await refusedWithoutHandler(
        call('GET', '/protected', [['authorization', `Bearer ${token.slice(0, -4)}AAAA`]]),
        401,
        'signature_invalid',
      );
      expect(reply.headers['www-authenticate']).toBe(
        'Bearer realm="api", error="invalid_token", error_description="The access token signature is invalid"',
      );
    });

    // Each token refused for what it says, not for its signature: every such code is 401 with
    // error="invalid_token" and its own fixed description (cases 18 to 23, 29, 31 to 34, 36, 37).
    const now = () => Math.floor(clock.now() / 1000);
    const claimCases: Array<[string, () => string]> = [
      ['header_unsupported', () => makeToken({ header: { zip: 'DEF' } })],
      ['claim_invalid', () => makeToken({ omit: ['exp'] })],
      ['token_not_yet_valid', () => makeToken({ claims: { nbf: now() + 600 } })],
      ['token_issued_in_future', () => makeToken({ claims: { iat: now() + 600, exp: now() + 900 } })],
      ['token_too_old', () => makeToken({ claims: { iat: now() - 7200, exp: now() + 300 } })],
      ['lifetime_too_long', () => makeToken({ claims: { exp: now() + 2 * 86_400 } })],
    ];
    it.each(claimCases)('%s is 401 invalid_token with its fixed description', async (code, make) => {
      const reply = await refusedWithoutHandler(
        call('GET', '/protected', [['authorization', `Bearer ${make()}`]]),
        401,
        code,
      );
      expect(reply.headers['www-authenticate']).toMatch(
        /^Bearer realm="api", error="invalid_token", error_description="[^"]+"$/,
      );
    });

    it('case 44: a 20 KB header never reaches the guard or handler; a 9 KB token is 400', async () => {
      const before = hits.length;
      // Node refuses it while parsing (431, or Fastify's client-error handler closing the connection).
      const huge = await call('GET', '/protected', [['authorization', `Bearer ${'a'.repeat(20_000)}`]]).then(
        (reply) => reply.status,
        () => 'connection closed',
      );
      expect([431, 400, 'connection closed']).toContain(huge);
      expect(hits.length).toBe(before);
      await refusedWithoutHandler(
        call('GET', '/protected', [['authorization', `Bearer ${'a'.repeat(9000)}`]]),
        400,
        'token_too_large',
      );
    });

    it('case 47: the gateway forwards without spoofed identity headers or the bearer, plus an internal token', async () => {
      const reply = await call('GET', '/forward', [
        ['authorization', `Bearer ${makeToken({ claims: { scope: 'orders:write' } })}`],
        ['x-user-id', 'admin'],
        ['X-USER-ROLE', 'root'],
        ['x_user_id', 'admin'],
        ['x-user-id', 'admin2'],
        ['x-internal-token', 'forged'],
        ['idem-internal-token', 'forged'],
        ['x-forwarded-user', 'admin'],
        ['x-auth-request-email', 'boss@example.com'],
        ['x-request-id', 'r-1'],
      ]);
      expect(reply.status).toBe(200);
      const forwarded = JSON.parse(reply.body) as Record<string, string>;
      const names = Object.keys(forwarded).map((name) => name.toLowerCase().replaceAll('_', '-'));
      for (const name of names) {
        expect(name).not.toMatch(/^(x-user-|x-auth-|x-internal-|x-forwarded-user$|authorization$)/);
      }
      expect(forwarded['x-request-id']).toBe('r-1');
      const internal = forwarded['idem-internal-token'] as string;
      expect(internal).not.toBe('forged');
      const downstream = await call('GET', '/internal', [['idem-internal-token', internal]]);
      expect(downstream.status).toBe(200);
      expect(JSON.parse(downstream.body)).toEqual({ sub: 'user-1', iss: ISSUER, scope: ['orders:write'] });
      expect((await call('GET', '/internal-write', [['idem-internal-token', internal]])).status).toBe(200);
    });

    it('behind the gateway: an internal token header sent twice is 400 multiple_tokens, as two Authorization headers are', async () => {
      const verified = await guard.verify(token);
      if (!verified.ok) throw new Error(verified.error.code);
      const internal = await internalIssuer.mint(verified.principal, { audience: 'orders' });
      expect((await call('GET', '/internal', [['idem-internal-token', internal]])).status).toBe(200);
      // A raw request keeps both copies (Fastify reads them from headersDistinct, Node joins them).
      await refusedWithoutHandler(
        call('GET', '/internal', [
          ['idem-internal-token', internal],
          ['idem-internal-token', internal],
        ]),
        400,
        'multiple_tokens',
      );
    });

    it('behind the gateway: edge tokens, forged tokens and missing tokens are refused', async () => {
      // An edge token is not the gateway's: refused (its issuer is unknown here, and its typ is wrong).
      await refusedWithoutHandler(call('GET', '/internal', [['idem-internal-token', token]]), 401, 'issuer_unknown');
      const gatewayIssued = makeToken({ claims: { iss: 'https://gateway.example', aud: 'orders' } });
      await refusedWithoutHandler(
        call('GET', '/internal', [['idem-internal-token', gatewayIssued]]),
        401,
        'type_invalid',
      );
      await refusedWithoutHandler(
        call('GET', '/internal', [['authorization', `Bearer ${token}`]]),
        401,
        'token_missing',
      );
      const verified = await guard.verify(token);
      if (!verified.ok) throw new Error(verified.error.code);
      const readOnly = await internalIssuer.mint(verified.principal, { audience: 'orders' });
      await refusedWithoutHandler(
        call('GET', '/internal-write', [['idem-internal-token', readOnly]]),
        403,
        'insufficient_scope',
      );
      const otherAudience = await internalIssuer.mint(verified.principal, { audience: 'billing' });
      await refusedWithoutHandler(
        call('GET', '/internal', [['idem-internal-token', otherAudience]]),
        401,
        'audience_invalid',
      );
    });

    it('case 48: a missing scope is 403 insufficient_scope with scope="orders:write"', async () => {
      const reply = await refusedWithoutHandler(
        call('GET', '/write', [['authorization', `Bearer ${token}`]]),
        403,
        'insufficient_scope',
      );
      expect(reply.headers['www-authenticate']).toBe(
        'Bearer realm="api", error="insufficient_scope", error_description="The access token lacks the privileges this request needs", scope="orders:write"',
      );
      const allowed = await call('GET', '/write', [
        ['authorization', `Bearer ${makeToken({ claims: { scope: 'orders:write' } })}`],
      ]);
      expect(allowed.status).toBe(200);
      await refusedWithoutHandler(
        call('GET', '/admin', [['authorization', `Bearer ${token}`]]),
        403,
        'insufficient_scope',
      );
      expect(
        (await call('GET', '/admin', [['authorization', `Bearer ${makeToken({ claims: { roles: ['admin'] } })}`]]))
          .status,
      ).toBe(200);
    });

    it('authorize() without a guard before it answers 401, never lets the request through', async () => {
      await refusedWithoutHandler(
        call('GET', '/authorize-only', [['authorization', `Bearer ${token}`]]),
        401,
        'token_missing',
      );
    });

    it('case 53: a CORS preflight carrying no token is 401 and never reaches the handler', async () => {
      await refusedWithoutHandler(
        call('OPTIONS', '/protected', [
          ['access-control-request-headers', 'authorization'],
          ['access-control-request-method', 'GET'],
          ['origin', 'https://app.example'],
        ]),
        401,
        'token_missing',
      );
    });

    it('case 54: hostile claims and kids are never reflected in the challenge', async () => {
      const cases: Array<[string, string, string]> = [
        [
          makeToken({ claims: { aud: '",error="none' } }),
          'audience_invalid',
          'The access token is not meant for this audience',
        ],
        [
          // The secret has no kid, so it is tried whatever the token names; another secret signed this.
          makeToken({ header: { kid: '"\\ x\r\nSet-Cookie: a=b' }, key: `${SECRET}-other` }),
          'signature_invalid',
          'The access token signature is invalid',
        ],
      ];
      for (const [hostile, code, description] of cases) {
        const reply = await refusedWithoutHandler(
          call('GET', '/protected', [['authorization', `Bearer ${hostile}`]]),
          401,
          code,
        );
        expect(reply.headers['www-authenticate']).toBe(
          `Bearer realm="api", error="invalid_token", error_description="${description}"`,
        );
        expect(reply.headers['set-cookie']).toBeUndefined();
      }
    });

    it('case 52: DPoP through the glue: method and URL come from the real request; replays are refused', async () => {
      const pair = testKeys().ec;
      const bound = makeToken({
        claims: { cnf: { jkt: await calculateJwkThumbprint(pair.publicJwk as never, 'sha256') } },
      });
      const proofFor = (htm: string, path: string) =>
        signSegments(
          b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: pair.publicJwk }),
          b64url({
            jti: randomUUID(),
            htm,
            htu: `${app.url}${path}`,
            iat: clock.seconds(),
            ath: createHash('sha256').update(bound).digest('base64url'),
          }),
          'ES256',
          pair.privateKey,
        );
      const proof = proofFor('POST', '/dpop');
      const headers: Array<[string, string]> = [
        ['authorization', `DPoP ${bound}`],
        ['dpop', proof],
        ['content-length', '0'],
      ];
      const accepted = await call('POST', '/dpop?page=1', headers);
      expect(accepted.status).toBe(200);
      expect(JSON.parse(accepted.body)).toEqual({ sub: 'user-1' });
      const replayed = await refusedWithoutHandler(call('POST', '/dpop?page=1', headers), 401, 'dpop_proof_replayed');
      expect(replayed.headers['www-authenticate']).toMatch(/^DPoP realm="api", error="invalid_dpop_proof"/);
      await refusedWithoutHandler(
        call('GET', '/dpop', [
          ['authorization', `DPoP ${bound}`],
          ['dpop', proofFor('POST', '/dpop')],
        ]),
        401,
        'dpop_proof_invalid',
      );
      await refusedWithoutHandler(
        call('POST', '/dpop', [
          ['authorization', `Bearer ${bound}`],
          ['content-length', '0'],
        ]),
        401,
        'token_bound',
      );
    });

    it('case 55: an expired token is 401 "The access token expired"', async () => {
      const expired = makeToken({ claims: { exp: clock.seconds() - 60 } });
      const reply = await refusedWithoutHandler(
        call('GET', '/protected', [['authorization', `Bearer ${expired}`]]),
        401,
        'token_expired',
      );
      expect(reply.headers['www-authenticate']).toContain('error_description="The access token expired"');
    });

    it('optional: a request that carries no credentials at all reaches the handler with no principal', async () => {
      for (const [method, path] of [
        ['GET', '/optional'],
        ['POST', '/optional'],
        // A query token this guard does not read is no credential of its (allowQueryToken is off).
        ['GET', '/optional?access_token=abc'],
        ['GET', '/optional-dpop'],
      ] as const) {
        const reply = await call(method, path, method === 'POST' ? [['content-length', '0']] : []);
        expect(reply.status, `${method} ${path}`).toBe(200);
        expect(JSON.parse(reply.body), `${method} ${path}`).toEqual({ sub: null });
      }
      const reply = await call('GET', '/optional', [['authorization', `Bearer ${token}`]]);
      expect(JSON.parse(reply.body)).toEqual({ sub: 'user-1' });
    });

    it('optional: any credential sent is verified, and a bad or foreign one is refused, never served as anonymous', async () => {
      await refusedWithoutHandler(
        call('GET', '/optional', [['authorization', 'Bearer not.a.jwt']]),
        401,
        'token_malformed',
      );
      const expired = makeToken({ claims: { exp: clock.seconds() - 60 } });
      await refusedWithoutHandler(
        call('GET', '/optional', [['authorization', `Bearer ${expired}`]]),
        401,
        'token_expired',
      );
      for (const credential of [`Basic ${token}`, '']) {
        const reply = await refusedWithoutHandler(
          call('GET', '/optional', [['authorization', credential]]),
          401,
          'token_missing',
        );
        expect(reply.headers['www-authenticate']).toBe(SHOP_CHALLENGE);
      }
      await refusedWithoutHandler(
        call('GET', '/optional', [
          ['authorization', `Bearer ${token}`],
          ['authorization', `Bearer ${token}`],
        ]),
        400,
        'multiple_tokens',
      );
      // Where the guard takes DPoP, a proof alone is a credential too: refused, not anonymous.
      await refusedWithoutHandler(call('GET', '/optional-dpop', [['dpop', 'x.y.z']]), 401, 'token_missing');
    });

    it("optional: authorize() and the idempotency middleware answer an anonymous request 401 with the guard's challenge", async () => {
      const read = await refusedWithoutHandler(call('GET', '/optional-read'), 401, 'token_missing');
      expect(read.headers['www-authenticate']).toBe(SHOP_CHALLENGE);
      expect((await call('GET', '/optional-read', [['authorization', `Bearer ${token}`]])).status).toBe(200);
      const key = `optional-${randomUUID()}`;
      const charge = (headers: Array<[string, string]>) =>
        call('POST', '/optional-charge', [['idempotency-key', key], ['content-length', '0'], ...headers]);
      // An anonymous write has no caller to scope its key to: not a 500 scope_missing.
      const anonymous = await refusedWithoutHandler(charge([]), 401, 'token_missing');
      expect(anonymous.headers['www-authenticate']).toBe(SHOP_CHALLENGE);
      const first = await charge([['authorization', `Bearer ${token}`]]);
      expect(first.status).toBe(201);
      const again = await charge([['authorization', `Bearer ${token}`]]);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toBe(first.body);
      expect(JSON.parse(first.body)).toMatchObject({ sub: 'user-1' });
    });

    it('optional: with a scope of its own, the idempotency middleware serves an anonymous write and replays it', async () => {
      const key = `optional-scoped-${randomUUID()}`;
      const charge = () =>
        call('POST', '/optional-scoped-charge', [
          ['idempotency-key', key],
          ['content-length', '0'],
        ]);
      const first = await charge();
      expect(first.status).toBe(201);
      expect(JSON.parse(first.body)).toMatchObject({ sub: null });
      const again = await charge();
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toBe(first.body);
    });

    it('DPoP server nonces through the glue: use_dpop_nonce with DPoP-Nonce, the retry passes, a nonce of the last window gets the next', async () => {
      const pair = testKeys().ec;
      const bound = makeToken({
        claims: {
          cnf: { jkt: await calculateJwkThumbprint(pair.publicJwk as never, 'sha256') },
          exp: clock.seconds() + 600,
        },
      });
      const sent = (nonce?: string) =>
        call('POST', '/dpop-nonce', [
          ['authorization', `DPoP ${bound}`],
          [
            'dpop',
            signSegments(
              b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: pair.publicJwk }),
              b64url({
                jti: randomUUID(),
                htm: 'POST',
                htu: `${app.url}/dpop-nonce`,
                iat: clock.seconds(),
                ath: createHash('sha256').update(bound).digest('base64url'),
                ...(nonce === undefined ? {} : { nonce }),
              }),
              'ES256',
              pair.privateKey,
            ),
          ],
          ['content-length', '0'],
        ]);
      const refused = await refusedWithoutHandler(sent(), 401, 'dpop_nonce_required');
      expect(refused.headers['www-authenticate']).toMatch(/^DPoP realm="api", error="use_dpop_nonce"/);
      const nonce = refused.headers['dpop-nonce'] as string;
      expect(nonce).toMatch(/\./);
      const passed = await sent(nonce);
      expect(passed.status).toBe(200);
      expect(passed.headers['dpop-nonce']).toBeUndefined();
      clock.advance(60);
      try {
        const rolled = await sent(nonce);
        expect(rolled.status).toBe(200);
        const next = rolled.headers['dpop-nonce'] as string;
        expect(next).toBeDefined();
        expect(next).not.toBe(nonce);
        expect((await sent(next)).status).toBe(200);
      } finally {
        clock.advance(-60);
      }
    });
  });
}
