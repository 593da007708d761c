import { randomUUID } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningGateway, startGateway } from '../src/gateway/server.js';
import { listen } from '../src/listen.js';
import { sendHostile } from './hostile-send.js';

// Lines of the gateway a mutation pass found unchecked: which upstream a path goes to, what the
// forwarded request keeps of the client's, and that the gateway never retries for the client.
// Only the gateway runs here, in front of two echo servers: nothing else is needed to see what it sends.

const issuer = 'https://issuer.gateway-routing.example';
const audience = 'http://gateway-routing.test';

interface Seen {
  url: string | undefined;
  method: string | undefined;
  headers: IncomingHttpHeaders;
}

let privateKey: CryptoKey;
let publicJwk: Record<string, unknown>;
let gateway: RunningGateway;
const servers: Server[] = [];
let apiBase = '';
const api: Seen[] = [];
const events: Seen[] = [];
// What the API echo answers next, by path: a 503 with Retry-After for `/busy`.
const busyPath = '/busy';

function echo(seen: Seen[]): Promise<string> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push({ url: req.url, method: req.method, headers: { ...req.headers } });
      if (req.url === busyPath) {
        res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '0' }).end('{}');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  servers.push(server);
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(server.address() as { port: number }).port}`)),
  );
}

beforeAll(async () => {
  const pair = await generateKeyPair('ES256', { extractable: true });
  privateKey = pair.privateKey;
  publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'k', alg: 'ES256' };
  const [apiUrl, eventsUrl] = await Promise.all([echo(api), echo(events)]);
  apiBase = apiUrl;
  gateway = await startGateway({
    port: 0,
    apiUrl,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [publicJwk] }, algorithms: ['ES256'] }],
    upstreams: [{ prefix: '/events', url: eventsUrl, audience: 'reference-receiver' }],
  });
}, 60_000);

afterAll(async () => {
  await gateway?.close();
  await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
});

function mint(): Promise<string> {
  const iat = Math.floor(Date.now() / 1000);
  return new SignJWT({ scope: 'photos:read', client_id: 'photo-app' })
    .setProtectedHeader({ alg: 'ES256', kid: 'k', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setSubject('user-alice')
    .setAudience(audience)
    .setIssuedAt(iat)
    .setExpirationTime(iat + 300)
    .setJti(randomUUID())
    .sign(privateKey);
}

/** The `aud` of the internal token a forwarded request carries. */
function internalAudience(seen: Seen | undefined): unknown {
  const token = String(seen?.headers['idem-internal-token']);
  return JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString()).aud;
}

describe('gateway: which upstream a path goes to', () => {
  it.each([
    ['the prefix itself', '/events', 'events'],
    ['a path under the prefix', '/events/evt_1?x=1', 'events'],
    ['a path that only starts with the prefix', '/events-x', 'api'],
    ['a path whose first segment extends the prefix', '/eventsx/1', 'api'],
  ])('sends %s (%s) to the %s, with that service as the internal audience', async (_name, path, to) => {
    api.length = 0;
    events.length = 0;
    const response = await fetch(new URL(path, gateway.url), { headers: { authorization: `Bearer ${await mint()}` } });
    expect(response.status).toBe(200);
    const [reached, other] = to === 'events' ? [events, api] : [api, events];
    expect(other).toEqual([]);
    expect(reached.map((seen) => seen.url)).toEqual([path]);
    expect(internalAudience(reached[0])).toBe(to === 'events' ? 'reference-receiver' : 'reference-api');
  });

  // reply-from reads a target starting `//` as a path of the upstream, never as another host; the
  // origin check must read it the same way, or such a path (a double slash a client library made)
  // would be refused as malformed.
  it('forwards a path that starts with // to the API as that path', async () => {
    api.length = 0;
    const answer = await sendHostile(
      { method: 'GET', path: '//photos', headers: { authorization: `Bearer ${await mint()}` } },
      gateway.url,
    );
    expect(answer?.status).toBe(200);
    expect(api.map((seen) => seen.url)).toEqual(['//photos']);
  });
});

describe('gateway: a target in absolute form', () => {
  // Node passes an absolute-form target (`GET http://host/path`) through as the URL: resolved, it
  // names another origin than the upstream's, which the proxy would refuse with an error of no
  // status (a 500). The origin check answers it as a malformed path instead, and forwards nothing.
  it('answers a target naming another host with 400 path_malformed, and forwards nothing', async () => {
    api.length = 0;
    const answer = await sendHostile(
      { method: 'GET', path: 'http://evil.example/photos', headers: { authorization: `Bearer ${await mint()}` } },
      gateway.url,
    );
    expect(answer?.status).toBe(400);
    expect(JSON.parse(answer?.text ?? '{}')).toMatchObject({ status: 400, code: 'path_malformed' });
    expect(api).toEqual([]);
  });

  // RFC 9112 section 3.2.2: a server MUST accept the absolute form, which a client configured with the
  // gateway as its forward proxy sends. Naming the gateway itself (the URL it listens on, or its
  // public base URL), it is the path it holds; it was resolved against the API's origin and refused.
  it.each([
    ['the URL it listens on', () => gateway.url],
    ['its public base URL', () => audience],
  ])('forwards a target naming %s as the path it holds, to the service of that path', async (_name, own) => {
    api.length = 0;
    events.length = 0;
    const token = await mint();
    const photos = await sendHostile(
      { method: 'GET', path: `${own()}/photos?limit=2`, headers: { authorization: `Bearer ${token}` } },
      gateway.url,
    );
    const event = await sendHostile(
      { method: 'GET', path: `${own()}/events/evt_1`, headers: { authorization: `Bearer ${await mint()}` } },
      gateway.url,
    );
    expect([photos?.status, event?.status]).toEqual([200, 200]);
    expect(api.map((seen) => seen.url)).toEqual(['/photos?limit=2']);
    expect(events.map((seen) => seen.url)).toEqual(['/events/evt_1']);
  });

  // The authority in the target replaces the Host header (RFC 9112 section 3.2.2): a Host naming
  // another host beside it changes nothing, and the API still gets its own host.
  it('takes the authority of an own-host target over a Host header that names another', async () => {
    api.length = 0;
    const answer = await sendHostile(
      {
        method: 'GET',
        path: `${gateway.url}/photos`,
        headers: { authorization: `Bearer ${await mint()}`, host: 'evil.example' },
      },
      gateway.url,
    );
    expect(answer?.status).toBe(200);
    expect(api.map((seen) => [seen.url, seen.headers.host])).toEqual([['/photos', new URL(apiBase).host]]);
  });

  // Only the gateway's own origin, exactly: another port or scheme of its host, credentials in the
  // authority, or the API's own origin (which resolved onto the API and was forwarded), is another
  // target the gateway does not serve (never an open proxy).
  it('still refuses a target on another port or scheme of its host, with user info, or naming the API', async () => {
    api.length = 0;
    const { host, port } = new URL(gateway.url);
    const targets = [
      `http://localhost:${Number(port) === 1 ? 2 : 1}/photos`,
      `https://${host}/photos`,
      `http://user@${host}/photos`,
      `${apiBase}/photos`,
    ];
    const statuses: Array<number | undefined> = [];
    for (const target of targets) {
      const answer = await sendHostile(
        { method: 'GET', path: target, headers: { authorization: `Bearer ${await mint()}` } },
        gateway.url,
      );
      statuses.push(answer?.status);
    }
    expect(statuses).toEqual([400, 400, 400, 400]);
    expect(api).toEqual([]);
  });
});

describe('gateway: a target in absolute form, on a port bound beforehand', () => {
  // A port from listen() brings every absolute-form target to the origin form for the pages behind
  // it, whatever host it names: the gateway takes its targets as sent there too, and reads them itself.
  it('forwards a target naming its own URL, and refuses one naming another host', async () => {
    const port = await listen(0);
    const bound = await startGateway({
      port,
      apiUrl: apiBase,
      baseUrl: audience,
      issuers: [{ issuer, jwks: { keys: [publicJwk] }, algorithms: ['ES256'] }],
    });
    try {
      api.length = 0;
      const send = async (target: string) =>
        (
          await sendHostile(
            { method: 'GET', path: target, headers: { authorization: `Bearer ${await mint()}` } },
            bound.url,
          )
        )?.status;
      expect([await send(`${bound.url}/photos`), await send('http://evil.example/photos')]).toEqual([200, 400]);
      expect(api.map((seen) => seen.url)).toEqual(['/photos']);
    } finally {
      await bound.close();
    }
  });
});

describe('gateway: what it forwards', () => {
  // The DPoP proof is bound to the gateway's URL and method: a credential for the gateway, which the
  // API must never see (it could replay it to the gateway within its lifetime).
  it('drops a DPoP header sent beside a bearer token', async () => {
    api.length = 0;
    const response = await fetch(new URL('/photos', gateway.url), {
      headers: { authorization: `Bearer ${await mint()}`, dpop: 'a.b.c' },
    });
    // A bearer token with a stray proof is still a bearer token; whether or not the guard takes it,
    // no proof may reach the API.
    if (response.status === 200) expect(api[0]?.headers.dpop).toBeUndefined();
    else expect(api).toEqual([]);
    expect(response.status).toBe(200);
  });

  // Research case 53: express-jwt lets a CORS preflight through on its own. The gateway has no CORS
  // layer, so a preflight is a request like any other: without a token it is refused, never forwarded.
  it('answers a CORS preflight without a token 401 with a bare challenge, and forwards nothing', async () => {
    api.length = 0;
    events.length = 0;
    for (const path of ['/photos', '/events']) {
      const response = await fetch(new URL(path, gateway.url), {
        method: 'OPTIONS',
        headers: {
          origin: 'https://app.example',
          'access-control-request-method': 'POST',
          'access-control-request-headers': 'authorization, content-type',
        },
      });
      expect(response.status).toBe(401);
      expect(response.headers.get('www-authenticate')).toMatch(/^Bearer realm="[^"]+"(?!.*error=)/);
      expect(response.headers.get('access-control-allow-origin')).toBeNull();
    }
    expect(api).toEqual([]);
    expect(events).toEqual([]);
  });

  // A repeated request is the client's decision, made with its key: reply-from by default retries a
  // GET the upstream answered 503 (up to 10 times, after its Retry-After).
  it('never retries a GET the API answered 503: the client gets the 503, the API saw one request', async () => {
    api.length = 0;
    const response = await fetch(new URL(busyPath, gateway.url), {
      headers: { authorization: `Bearer ${await mint()}` },
    });
    expect(response.status).toBe(503);
    expect(api.length).toBe(1);
  });
});

// With `authUrl` the gateway builds its issuer from discovery: RS256 only (the provider's one
// algorithm) and the RFC 9068 claims `client_id`, `iat` and `jti` required. The tests with their own
// `issuers` never reach that branch; here discovery and the JWKS come from an injected fetch.
describe('gateway: the issuer it discovers', () => {
  const authUrl = 'https://idp.gateway-routing.example';
  let discovered: RunningGateway;
  let rsaKey: CryptoKey;
  let ecKey: CryptoKey;

  beforeAll(async () => {
    const rsa = await generateKeyPair('RS256', { extractable: true });
    const ec = await generateKeyPair('ES256', { extractable: true });
    rsaKey = rsa.privateKey;
    ecKey = ec.privateKey;
    const keys = [
      { ...(await exportJWK(rsa.publicKey)), kid: 'rsa', alg: 'RS256', use: 'sig' },
      { ...(await exportJWK(ec.publicKey)), kid: 'ec', alg: 'ES256', use: 'sig' },
    ];
    const fakeFetch = (async (input: string | URL | Request) => {
      const url = String(input instanceof Request ? input.url : input);
      if (url === `${authUrl}/.well-known/openid-configuration`) {
        return Response.json({ issuer: authUrl, jwks_uri: `${authUrl}/jwks` });
      }
      if (url === `${authUrl}/jwks`) return Response.json({ keys });
      return new Response('not found', { status: 404 });
    }) as typeof globalThis.fetch;
    discovered = await startGateway({ port: 0, apiUrl: apiBase, baseUrl: audience, authUrl, fetch: fakeFetch });
  }, 60_000);

  afterAll(async () => {
    await discovered?.close();
  });

  const token = (options: { omit?: 'jti' | 'client_id' | 'iat'; alg?: 'RS256' | 'ES256' } = {}) => {
    const iat = Math.floor(Date.now() / 1000);
    const alg = options.alg ?? 'RS256';
    const jwt = new SignJWT(
      options.omit === 'client_id' ? { scope: 'photos:read' } : { scope: 'photos:read', client_id: 'photo-app' },
    )
      .setProtectedHeader({ alg, kid: alg === 'RS256' ? 'rsa' : 'ec', typ: 'at+jwt' })
      .setIssuer(authUrl)
      .setSubject('user-alice')
      .setAudience(audience)
      .setExpirationTime(iat + 300);
    if (options.omit !== 'iat') jwt.setIssuedAt(iat);
    if (options.omit !== 'jti') jwt.setJti(randomUUID());
    return jwt.sign(alg === 'RS256' ? rsaKey : ecKey);
  };

  it('takes an RS256 token with client_id, iat and jti (the control case)', async () => {
    const response = await fetch(new URL('/photos', discovered.url), {
      headers: { authorization: `Bearer ${await token()}` },
    });
    expect(response.status).toBe(200);
  });

  it.each([
    ['without a jti', { omit: 'jti' as const }],
    ['without a client_id', { omit: 'client_id' as const }],
    // RFC 9068 §2.2 requires iat too; the gateway sets no maxTokenAge, so only requiredClaims asks for it.
    ['without an iat', { omit: 'iat' as const }],
    ['signed ES256 by a key of its JWKS', { alg: 'ES256' as const }],
  ])('refuses a token %s with 401', async (_name, options) => {
    const response = await fetch(new URL('/photos', discovered.url), {
      headers: { authorization: `Bearer ${await token(options)}` },
    });
    expect(response.status).toBe(401);
  });
});

describe('gateway: its protected resource metadata (RFC 9728)', () => {
  // Public and the same for every caller: a client (or a shared cache) may keep it for 5 minutes
  // instead of fetching it again before each call.
  it('is cacheable by anyone for 5 minutes, and names the resource and its issuers', async () => {
    const response = await fetch(new URL('/.well-known/oauth-protected-resource', gateway.url));
    expect(response.status).toBe(200);
    expect(response.headers.get('cache-control')).toBe('public, max-age=300');
    expect(await response.json()).toMatchObject({
      resource: audience,
      authorization_servers: [issuer],
      bearer_methods_supported: ['header'],
    });
  });
});
