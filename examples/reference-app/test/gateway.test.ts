import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { createInternalTokenIssuer, principalFromClaims } from '@idem/guard';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { sendHostile } from './hostile-send.js';
import { closeTestRedis, openTestDatabase, openTestRedis } from './services.js';

// The gateway trusts a test issuer whose key only this file holds; tokens are minted per test.
const issuer = 'https://issuer.gateway-test.example';
const audience = 'http://gateway.test';
let offsetMs = 0;
const now = () => Date.now() + offsetMs;

let db: Database;
let redis: Awaited<ReturnType<typeof openTestRedis>>;
let stack: RunningResourceStack;
let privateKey: CryptoKey;
let otherKey: CryptoKey;
let publicJwk: Record<string, unknown>;

beforeAll(async () => {
  const pair = await generateKeyPair('ES256', { extractable: true });
  privateKey = pair.privateKey;
  otherKey = (await generateKeyPair('ES256')).privateKey;
  const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'test-key', alg: 'ES256' };
  publicJwk = jwk;
  db = await openTestDatabase('gateway');
  redis = await openTestRedis('gateway');
  stack = await startResourceStack({
    db,
    gatewayPort: 0,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'], requiredClaims: ['client_id', 'iat', 'jti'] }],
    relay: false,
    ...(redis ? { redis } : {}),
    now,
  });
  // Starting three servers and a database is slow on a loaded 2-core machine; nothing here waits on time.
}, 60_000);

afterAll(async () => {
  await stack?.close();
  await closeTestRedis(redis);
  await db?.close();
});

interface MintOptions {
  sub?: string;
  scope?: string;
  roles?: string[];
  aud?: string;
  typ?: string;
  key?: CryptoKey;
  lifetime?: number;
  extra?: Record<string, unknown>;
}

function mint(options: MintOptions = {}): Promise<string> {
  const iat = Math.floor(now() / 1000);
  return new SignJWT({
    scope: options.scope ?? 'photos:read photos:write stock:read charges:write settings:write',
    roles: options.roles ?? [],
    client_id: 'photo-app',
    ...options.extra,
  })
    .setProtectedHeader({ alg: 'ES256', kid: 'test-key', typ: options.typ ?? 'at+jwt' })
    .setIssuer(issuer)
    .setSubject(options.sub ?? 'user-alice')
    .setAudience(options.aud ?? audience)
    .setIssuedAt(iat)
    .setExpirationTime(iat + (options.lifetime ?? 300))
    .setJti(randomUUID())
    .sign(options.key ?? privateKey);
}

async function call(path: string, init: RequestInit & { token?: string } = {}) {
  const headers = new Headers(init.headers);
  if (init.token) headers.set('authorization', `Bearer ${init.token}`);
  const response = await fetch(new URL(path, stack.gateway.url), { ...init, headers });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: () => JSON.parse(text) };
}

async function expectUnauthorized(token: string | undefined, code: string) {
  const response = await call('/photos', token === undefined ? {} : { token });
  expect(response.status).toBe(401);
  expect(response.headers.get('content-type')).toContain('application/problem+json');
  expect(response.headers.get('www-authenticate')).toMatch(/^Bearer realm="reference-api"/);
  expect(response.json()).toMatchObject({ status: 401, code });
  return response;
}

describe('gateway: bad tokens are 401 with a challenge', () => {
  it('refuses a request without a token, with a challenge carrying no error (RFC 6750 §3.1)', async () => {
    const response = await expectUnauthorized(undefined, 'token_missing');
    expect(response.headers.get('www-authenticate')).not.toContain('error=');
    expect(response.headers.get('www-authenticate')).toContain(
      `resource_metadata="${audience}/.well-known/oauth-protected-resource"`,
    );
  });

  it('refuses a token that is not a JWT', async () => {
    const response = await expectUnauthorized('not-a-token', 'token_malformed');
    expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"');
  });

  it('refuses a tampered token (payload changed, signature kept)', async () => {
    const token = await mint({ scope: 'photos:read' });
    const [header, payload, signature] = token.split('.') as [string, string, string];
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
    claims.sub = 'user-bob';
    const tampered = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.${signature}`;
    await expectUnauthorized(tampered, 'signature_invalid');
  });

  it('refuses a token signed by a key the issuer does not publish', async () => {
    await expectUnauthorized(await mint({ key: otherKey }), 'signature_invalid');
  });

  it('refuses an expired token (the clock is injected, nothing sleeps)', async () => {
    const token = await mint({ lifetime: 60 });
    expect((await call('/photos', { token })).status).toBe(200);
    offsetMs = 120_000;
    try {
      await expectUnauthorized(token, 'token_expired');
    } finally {
      offsetMs = 0;
    }
  });

  it('refuses a token for another audience', async () => {
    await expectUnauthorized(await mint({ aud: 'http://another-api.example' }), 'audience_invalid');
  });

  it('refuses a token that is not typed at+jwt, such as an ID token', async () => {
    await expectUnauthorized(await mint({ typ: 'JWT', extra: { nonce: 'n' } }), 'type_invalid');
  });

  it("refuses the gateway's own internal token presented as a bearer", async () => {
    const internal = createInternalTokenIssuer({ issuer });
    const token = await internal.mint(principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience }), {
      audience,
    });
    await expectUnauthorized(token, 'type_invalid');
  });

  it('refuses before routing: an unknown path without a token is 401, not 404', async () => {
    const response = await call('/no/such/route');
    expect(response.status).toBe(401);
  });
});

describe('gateway: forwarding', () => {
  it('forwards a valid request with its query string and answers with the API', async () => {
    const response = await call('/stock?item=item-1', { token: await mint() });
    expect(response.status).toBe(200);
    expect(response.json()).toEqual({ item: 'item-1', level: 7 });
  });

  it('streams a request body through untouched', async () => {
    const token = await mint();
    const response = await call('/settings', {
      token,
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: '{"theme":"dark"}',
    });
    expect(response.status).toBe(200);
    expect(response.json()).toEqual({ theme: 'dark' });
  });

  it("passes on none of the API's hop-by-hop headers, and honours the client's Connection: close", async () => {
    // The gateway's connection to the API is its own (RFC 9110 §7.6.1): copying the API's
    // `connection: keep-alive` and `keep-alive: timeout=…` would both mislead the client and keep its
    // connection open after it asked for close (RFC 9112 §9.6).
    const { port } = new URL(stack.gateway.url);
    const request = [
      'GET /stock?item=item-1 HTTP/1.1',
      'Host: localhost',
      `Authorization: Bearer ${await mint()}`,
      'Connection: close',
      '',
      '',
    ].join('\r\n');
    const { text, closed } = await new Promise<{ text: string; closed: boolean }>((resolve, reject) => {
      const socket = connect(Number(port), 'localhost', () => socket.write(request));
      let received = '';
      const timer = setTimeout(() => {
        socket.destroy();
        resolve({ text: received, closed: false });
      }, 3000);
      socket.on('data', (chunk) => {
        received += chunk;
      });
      socket.on('error', reject);
      socket.on('close', () => {
        clearTimeout(timer);
        resolve({ text: received, closed: true });
      });
    });
    const head = text.slice(0, text.indexOf('\r\n\r\n')).toLowerCase();
    expect(head).toMatch(/^http\/1\.1 200/);
    expect(head).not.toMatch(/\r\nkeep-alive:/);
    expect(head).not.toMatch(/\r\nconnection: keep-alive/);
    expect(closed).toBe(true);
  });

  it('answers 404 problem+json from the API for an unknown path with a valid token', async () => {
    const response = await call('/no/such/route', { token: await mint() });
    expect(response.status).toBe(404);
    expect(response.json()).toMatchObject({ code: 'route_not_found' });
  });

  it('answers a method it forwards nowhere (PROPFIND) with a valid token: 405 problem+json with Allow', async () => {
    const response = await call('/photos/%3Cb%3Eprobe%3C%2Fb%3E', { method: 'PROPFIND', token: await mint() });
    expect(response.status).toBe(405);
    expect(response.headers.get('content-type')).toContain('application/problem+json');
    expect(response.headers.get('allow')).toBe('GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS');
    expect(response.json()).toMatchObject({ status: 405, code: 'method_not_allowed' });
    expect(response.text).not.toContain('probe');
  });

  it('serves RFC 9728 protected-resource metadata', async () => {
    const response = await call('/.well-known/oauth-protected-resource');
    expect(response.status).toBe(200);
    expect(response.json()).toMatchObject({ resource: audience, authorization_servers: [issuer] });
  });
});

describe('gateway: health', () => {
  // An operator's probe (a load balancer, an orchestrator) sends no token: every other path of the
  // gateway answers it 401, which a probe reads as down.
  it('answers GET /healthz without a token: 200, not cached', async () => {
    const response = await call('/healthz');
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^application\/json/);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(response.json()).toEqual({ status: 'ok' });
  });

  it('answers HEAD /healthz the same, without a body', async () => {
    const response = await call('/healthz', { method: 'HEAD' });
    expect(response.status).toBe(200);
    expect(response.text).toBe('');
  });

  it('takes no token and reads none: a bad one changes nothing', async () => {
    const response = await call('/healthz', { token: 'not.a.token' });
    expect(response.status).toBe(200);
  });

  it('is the one path answered without a token: a path under it, or another method, still needs one', async () => {
    expect((await call('/healthz/x')).status).toBe(401);
    expect((await call('/healthz', { method: 'POST' })).status).toBe(401);
  });
});

describe('gateway: not permitted is 403', () => {
  it('refuses a charge without charges:write, naming the scope in the challenge', async () => {
    const response = await call('/charges', {
      token: await mint({ scope: 'photos:read' }),
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: 100, currency: 'EUR' }),
    });
    expect(response.status).toBe(403);
    expect(response.headers.get('www-authenticate')).toContain('error="insufficient_scope"');
    expect(response.headers.get('www-authenticate')).toContain('scope="charges:write"');
    expect(response.json()).toMatchObject({ code: 'insufficient_scope' });
    const { rows } = await db.query('select id from api_charges');
    expect(rows).toHaveLength(0);
  });

  it('refuses PUT /stock for a caller without the admin role', async () => {
    const response = await call('/stock/item-2', {
      token: await mint({ roles: ['viewer'] }),
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ level: 1 }),
    });
    expect(response.status).toBe(403);
    const { rows } = await db.query<{ level: number }>('select level from api_stock where item = $1', ['item-2']);
    expect(rows[0]?.level).toBe(14);
  });
});

describe('gateway: spoofed identity headers have no effect', () => {
  it.each([
    ['X-User-Id', 'user-bob'],
    ['X-User-Sub', 'user-bob'],
    ['X_User_Id', 'user-bob'],
    ['X-Auth-Request-User', 'user-bob'],
    ['X-Auth-Roles', 'admin'],
    ['X-Forwarded-User', 'user-bob'],
  ])('%s: %s changes nothing', async (name, value) => {
    const response = await call('/photos', { token: await mint({ scope: 'photos:read' }), headers: { [name]: value } });
    expect(response.status).toBe(200);
    const ids = (response.json() as { photos: Array<{ id: string }> }).photos.map((photo) => photo.id);
    expect(ids.length).toBeGreaterThan(0);
    expect(ids.every((id) => id.startsWith('photo-alice-'))).toBe(true);
  });

  it('a spoofed role header does not make a viewer an admin', async () => {
    const response = await call('/stock/item-3', {
      token: await mint({ roles: [] }),
      method: 'PUT',
      headers: { 'content-type': 'application/json', 'X-Auth-Roles': 'admin', 'X-User-Roles': 'admin' },
      body: JSON.stringify({ level: 0 }),
    });
    expect(response.status).toBe(403);
  });

  it("a client-sent internal token is replaced by the gateway's own", async () => {
    // A token minted by a key the API does not trust, claiming to be bob: the gateway drops it.
    const forged = await createInternalTokenIssuer({ issuer: 'reference-gateway' }).mint(
      principalFromClaims({ sub: 'user-bob', iss: issuer, aud: audience, scope: 'photos:read' }),
      { audience: 'reference-api' },
    );
    const response = await call('/photos', {
      token: await mint({ scope: 'photos:read' }),
      headers: { 'idem-internal-token': forged },
    });
    expect(response.status).toBe(200);
    const ids = (response.json() as { photos: Array<{ id: string }> }).photos.map((photo) => photo.id);
    expect(ids.every((id) => id.startsWith('photo-alice-'))).toBe(true);
  });
});

describe('API: only the gateway gets in', () => {
  it('listens on loopback only', () => {
    expect(new URL(stack.api.url).hostname).toBe('127.0.0.1');
  });

  it('refuses a direct call without an internal token', async () => {
    const response = await fetch(new URL('/photos', stack.api.url));
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toMatch(/^Bearer /);
    expect(await response.json()).toMatchObject({ code: 'token_missing' });
  });

  it("refuses a direct call carrying the caller's access token", async () => {
    const response = await fetch(new URL('/photos', stack.api.url), {
      headers: { authorization: `Bearer ${await mint()}` },
    });
    expect(response.status).toBe(401);
  });

  it('refuses an internal token signed by another key', async () => {
    const forged = await createInternalTokenIssuer({ issuer: 'reference-gateway' }).mint(
      principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience, scope: 'photos:read' }),
      { audience: 'reference-api' },
    );
    const response = await fetch(new URL('/photos', stack.api.url), { headers: { 'idem-internal-token': forged } });
    expect(response.status).toBe(401);
  });

  it("refuses the gateway's internal token minted for another service", async () => {
    const token = await stack.gateway.internalIssuer.mint(
      principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience, scope: 'photos:read' }),
      { audience: 'another-service' },
    );
    const response = await fetch(new URL('/photos', stack.api.url), { headers: { 'idem-internal-token': token } });
    expect(response.status).toBe(401);
    expect(await response.json()).toMatchObject({ code: 'audience_invalid' });
  });

  it("accepts the gateway's internal token for the API (the control case)", async () => {
    const token = await stack.gateway.internalIssuer.mint(
      principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience, scope: 'photos:read' }),
      { audience: 'reference-api' },
    );
    const response = await fetch(new URL('/photos', stack.api.url), { headers: { 'idem-internal-token': token } });
    expect(response.status).toBe(200);
  });

  it('answers a path parameter that does not decode with 400 path_malformed, not a 500', async () => {
    // The gateway refuses such a path itself; a direct call with its internal token reaches the router.
    const token = await stack.gateway.internalIssuer.mint(
      principalFromClaims({ sub: 'user-alice', iss: issuer, aud: audience, scope: 'photos:write' }),
      { audience: 'reference-api' },
    );
    const response = await fetch(new URL('/photos/%zz', stack.api.url), {
      method: 'DELETE',
      headers: { 'idem-internal-token': token },
    });
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(await response.json()).toMatchObject({ status: 400, code: 'path_malformed' });
  });
});

// A gateway of its own (another key than the shared stack's) in front of the API port given.
async function gatewayTo(port: number) {
  const { startGateway } = await import('../src/gateway/server.js');
  return startGateway({
    port: 0,
    apiUrl: `http://127.0.0.1:${port}`,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [publicJwk] }, algorithms: ['ES256'] }],
    now,
  });
}

// The gateway alone in front of a server that echoes the request it got, so a test sees exactly what
// the gateway forwards.
async function gatewayBeforeEcho() {
  const { createServer } = await import('node:http');
  const seen: Array<{ headers: Record<string, unknown>; body: string; url: string | undefined }> = [];
  const echo = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      seen.push({ headers: { ...req.headers }, body: Buffer.concat(chunks).toString(), url: req.url });
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const gateway = await gatewayTo((echo.address() as { port: number }).port);
  return {
    url: gateway.url,
    seen,
    async close() {
      await gateway.close();
      await new Promise<void>((resolve) => echo.close(() => resolve()));
    },
  };
}

describe('gateway: what reaches the upstream', () => {
  it('strips identity headers by namespace, drops the bearer and cookies, adds one internal token', async () => {
    const { url, seen, close } = await gatewayBeforeEcho();
    try {
      const body = '{"amount": 100,  "currency":"EUR"}';
      const response = await fetch(new URL('/charges?x=1', url), {
        method: 'POST',
        headers: {
          authorization: `Bearer ${await mint()}`,
          cookie: 'session=secret',
          'content-type': 'application/json',
          'idempotency-key': '"abc"',
          'x-user-id': 'user-bob',
          'X-Auth-Request-Email': 'bob@example.com',
          x_user_roles: 'admin',
          'x-internal-debug': '1',
          'idem-internal-token': 'forged',
          'x-request-note': 'kept',
        },
        body,
      });
      expect(response.status).toBe(200);
      const forwarded = seen[0];
      expect(forwarded?.url).toBe('/charges?x=1');
      expect(forwarded?.body).toBe(body);
      const names = Object.keys(forwarded?.headers ?? {});
      for (const name of names) expect(name).not.toMatch(/^(x[-_]user[-_]|x[-_]auth[-_]|x[-_]internal[-_])/);
      expect(names).not.toContain('authorization');
      expect(names).not.toContain('cookie');
      expect(forwarded?.headers['idempotency-key']).toBe('"abc"');
      expect(forwarded?.headers['x-request-note']).toBe('kept');
      const internal = String(forwarded?.headers['idem-internal-token']);
      expect(internal).not.toBe('forged');
      const verified = await stack.api.verifier.verify(internal);
      // Another gateway instance, another key: the shared stack's API must not accept it.
      expect(verified.ok).toBe(false);
      const [, payload] = internal.split('.') as [string, string];
      const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
      expect(claims).toMatchObject({ sub: 'user-alice', aud: 'reference-api', orig_iss: issuer });
      expect(claims.exp - claims.iat).toBeLessThanOrEqual(60);
    } finally {
      await close();
    }
  });

  // Spec 5.4 (identity headers sent by the client are never trusted; only what the gateway stamps):
  // the gateway strips by namespace, the roots of its own namespaces and their hyphenless spellings
  // included, and the names other authenticating proxies write for the services behind them: `X-User`
  // (Ory Oathkeeper's header mutator), a bare `X-Auth`, `X-UserId`, `X-Userinfo` (Kong's OIDC plugin)
  // and Pomerium's `X-Pomerium-Claim-*` / `X-Pomerium-Jwt-Assertion`. The reference API reads none of
  // them, but an upstream moved from behind one of those proxies would take them for the gateway's word.
  it('strips X-User, X-Auth, X-UserId, X-Userinfo and X-Pomerium-* before forwarding', async () => {
    const { url, seen, close } = await gatewayBeforeEcho();
    try {
      const spoofed = {
        'X-User': 'user-bob',
        'X-Auth': 'admin',
        'X-UserId': 'user-bob',
        'X-Userinfo': Buffer.from('{"sub":"user-bob","roles":["admin"]}').toString('base64'),
        'X-Pomerium-Claim-Email': 'bob@example.com',
        'X-Pomerium-Jwt-Assertion': 'forged',
      };
      const response = await fetch(new URL('/photos', url), {
        headers: { authorization: `Bearer ${await mint()}`, ...spoofed, 'x-request-note': 'kept' },
      });
      expect(response.status).toBe(200);
      const forwarded = seen[0]?.headers ?? {};
      expect(forwarded['x-request-note']).toBe('kept');
      const leaked = Object.keys(spoofed).filter((name) => name.toLowerCase() in forwarded);
      expect(leaked).toEqual([]);
    } finally {
      await close();
    }
  });
});

// RFC 6750 §2.3: a token in the URL lands in access logs (the API's, any proxy's) and in Referer. The
// gateway reads tokens from the header only (bearer_methods_supported: header), so the query is not a
// second credential for it to read, but forwarded it would still carry the token on. A request with
// a header token and an `access_token` parameter uses two methods at once (RFC 6750 §2): 400
// invalid_request, the guard's `multiple_tokens`, and nothing reaches any service.
describe('gateway: a token in the query is never forwarded', () => {
  it('refuses a header token plus ?access_token= with 400 invalid_request problem+json, through gateway and API', async () => {
    const token = await mint();
    const response = await call(`/stock?item=item-1&access_token=${token}`, { token });
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toContain('application/problem+json');
    expect(response.headers.get('www-authenticate')).toMatch(
      /^Bearer realm="reference-api", error="invalid_request", error_description="[^"]+"/,
    );
    expect(response.json()).toMatchObject({ status: 400, code: 'multiple_tokens', retryable: false });
    for (const part of token.split('.')) expect(response.text).not.toContain(part);
    // The control case: the same request without the parameter goes through to the API.
    expect((await call('/stock?item=item-1', { token })).status).toBe(200);
  });

  it('forwards no spelling of the parameter to the upstream; other parameters go through', async () => {
    const { url, seen, close } = await gatewayBeforeEcho();
    try {
      const send = async (path: string, method = 'GET') =>
        (await fetch(new URL(path, url), { method, headers: { authorization: `Bearer ${await mint()}` } })).status;
      const leaked = 'eyJhbGciOiJFUzI1NiJ9.e30.c2ln';
      for (const path of [
        `/photos?access_token=${leaked}`,
        `/photos?a=1&access_token=${leaked}`,
        `/photos?access%5Ftoken=${leaked}`,
        '/photos?access_token=',
        '/photos?access_token',
        `/webhook-events?access_token=${leaked}`,
      ]) {
        expect(await send(path), path).toBe(400);
        expect(await send(path, 'POST'), `POST ${path}`).toBe(400);
      }
      expect(seen).toEqual([]);
      for (const path of ['/photos?token=x', '/photos?my_access_token=x', '/photos?x=access_token']) {
        expect(await send(path), path).toBe(200);
      }
      expect(seen.map((request) => request.url)).toEqual([
        '/photos?token=x',
        '/photos?my_access_token=x',
        '/photos?x=access_token',
      ]);
    } finally {
      await close();
    }
  });

  it('a token only in the query is no credential: 401 without an error code, as the guard answers (RFC 6750 §3.1)', async () => {
    const response = await call(`/photos?access_token=${await mint()}`);
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).not.toContain('error=');
    expect(response.json()).toMatchObject({ status: 401, code: 'token_missing' });
  });
});

describe('gateway: other upstreams', () => {
  it.each(['webhook-events', '/', '/a/b', '/Events', '/x?y'])(
    'refuses the upstream prefix %j at start',
    async (prefix) => {
      const { startGateway } = await import('../src/gateway/server.js');
      await expect(
        startGateway({
          port: 0,
          apiUrl: stack.api.url,
          baseUrl: audience,
          issuers: [{ issuer, jwks: { keys: [publicJwk] }, algorithms: ['ES256'] }],
          upstreams: [{ prefix, url: stack.receiver.url, audience: 'reference-receiver' }],
        }),
      ).rejects.toThrow(TypeError);
    },
  );
});

describe('gateway: upstream down', () => {
  it('answers 502 problem+json, retryable, when the API cannot be reached', async () => {
    const { createServer } = await import('node:http');
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as { port: number }).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const gateway = await gatewayTo(port);
    try {
      const response = await fetch(new URL('/photos', gateway.url), {
        headers: { authorization: `Bearer ${await mint()}` },
      });
      expect(response.status).toBe(502);
      expect(response.headers.get('content-type')).toContain('application/problem+json');
      expect(await response.json()).toMatchObject({ code: 'upstream_unavailable', retryable: true });
    } finally {
      await gateway.close();
    }
  });
});

// README: errors are application/problem+json (RFC 9457), the ones Fastify and reply-from raise too.
describe('gateway: its own refusals are problem+json', () => {
  it.each([
    ['a path that does not decode, without a token', '/photos/%E0%A4%A', false],
    ['a path that does not decode, with a token', '/photos/%E0%A4%A', true],
    ['a path that climbs out with ..', '/webhook-events/..%2F', true],
  ])('answers %s with 400 path_malformed', async (_name, path, withToken) => {
    const response = await call(path, withToken ? { token: await mint() } : {});
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(response.json()).toMatchObject({ status: 400, code: 'path_malformed', retryable: false });
    expect(response.text).not.toContain('%E0');
  });

  // URL parsing reads `\` as `/`: the proxy resolved `/\evil.example/x` to another host (and refused
  // it with an error of no status, a 500), and `/\?` did not parse at all (a 500 too).
  it.each([
    ['a backslash that would name another host', '/\\evil.example/photos'],
    ['a backslash before the query', '/\\?'],
    ['a backslash inside the path', '/photos\\..\\settings'],
  ])('answers %s with 400 path_malformed, before anything is forwarded', async (_name, path) => {
    // fetch would turn the backslashes into slashes before sending; node:http sends them as they are.
    const answer = await sendHostile(
      { method: 'GET', path, headers: { authorization: `Bearer ${await mint()}` } },
      stack.gateway.url,
    );
    expect(answer?.status).toBe(400);
    expect(answer?.contentType).toMatch(/^application\/problem\+json/);
    expect(JSON.parse(answer?.text ?? '{}')).toMatchObject({ status: 400, code: 'path_malformed' });
  });
});
