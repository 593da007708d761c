import { inspect } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { authorizeRequest, createGuard, type GuardEvent, principalFromClaims, requireScopes } from '../src/index.js';
import { startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, testKeys } from './support/tokens.js';

// A JWKS URL may carry a credential in its query (a signed URL, an API key some providers take as a
// parameter). The guard fetches the URL as configured, and reports it without the query or fragment:
// events go to logs and metrics, where a credential must never land.

const keys = testKeys();
const jwk = (kid: string) => ({ ...keys.ec.publicJwk, kid, alg: 'ES256', use: 'sig' });
const SECRET_QUERY = 'X-Amz-Signature=topsecret1234&token=hunter2';

let servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(servers.map((server) => server.close()));
  servers = [];
});

describe('a JWKS URI in events', () => {
  it('is reported without its query or fragment, on every event kind, and fetched with them', async () => {
    const server = await startJwksServer({
      kind: 'json',
      // One key dropped (a key for encryption), one kept.
      body: { keys: [jwk('k1'), { ...jwk('enc'), use: 'enc' }] },
      headers: { 'cache-control': 'max-age=60' },
    });
    servers.push(server);
    const clock = manualClock();
    const events: GuardEvent[] = [];
    const fetched: string[] = [];
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: false,
      onEvent: (event) => events.push(event),
      fetch: (input, init) => {
        fetched.push(String(input));
        return globalThis.fetch(input, init);
      },
      issuers: [
        {
          issuer: ISSUER,
          jwksUri: `${server.url}?${SECRET_QUERY}#frag`,
          algorithms: ['ES256'],
          jwksOptions: { cooldown: 1, staleIfError: 3600 },
        },
      ],
    });
    const token = () =>
      makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now(), claims: {} });
    expect((await guard.verify(token())).ok).toBe(true);
    // A set refused as a whole (a private key in it), then an endpoint down: rejected, failed, stale.
    clock.advance(61);
    server.set({ kind: 'json', body: { keys: [{ ...jwk('k1'), d: 'AAAA' }] } });
    expect((await guard.verify(token())).ok).toBe(true);
    clock.advance(2);
    server.set({ kind: 'raw', status: 500, body: '{}' });
    expect((await guard.verify(token())).ok).toBe(true);
    await guard.refreshKeys();

    expect(fetched[0]).toBe(`${server.url}?${SECRET_QUERY}`);
    const kinds = new Set(events.map((event) => event.type));
    for (const kind of ['jwks-fetch', 'jwks-key-dropped', 'jwks-rejected', 'jwks-stale']) expect(kinds).toContain(kind);
    for (const event of events) {
      if ('uri' in event) expect(event.uri).toBe(server.url);
      expect(JSON.stringify(event)).not.toMatch(/topsecret|hunter2|frag/);
    }
  });
});

describe('resourceMetadata', () => {
  // It is written into every challenge, so a user name or password in it would go to every client.
  it('refuses a URL with user information, without quoting it, and keeps a query', () => {
    const base = { audience: AUDIENCE, issuers: [{ issuer: ISSUER, publicKeys: [keys.ec.publicPem] }] };
    for (const resourceMetadata of ['https://user:hunter2@api.example/meta', 'https://hunter2@api.example/meta']) {
      expect(() => createGuard({ ...base, resourceMetadata })).toThrow(/user name or password/);
      expect(() => createGuard({ ...base, resourceMetadata })).not.toThrow(/hunter2/);
    }
    // authorizeRequest writes its own challenge from its options: the same refusal (it took one before).
    const principal = principalFromClaims({ sub: 'u1', iss: ISSUER, aud: AUDIENCE, scope: 'orders:read' });
    const authorize = (resourceMetadata: string) => () =>
      authorizeRequest(principal, [requireScopes('orders:write')], { headers: {} }, { resourceMetadata });
    expect(authorize('https://user:hunter2@api.example/meta')).toThrow(/user name or password/);
    expect(authorize('https://user:hunter2@api.example/meta')).not.toThrow(/hunter2/);
    expect(authorize('https://api.example/meta')).not.toThrow();
    const guard = createGuard({ ...base, resourceMetadata: 'https://api.example/meta?tenant=t1' });
    expect(guard.error('token_missing').wwwAuthenticate).toContain(
      'resource_metadata="https://api.example/meta?tenant=t1"',
    );
  });
});

describe('a jwksUri that does not parse', () => {
  // Was a defect: the TypeError's cause was the URL parser's error, whose `input` is the whole value:
  // a logger printing the error with its cause (util.inspect does) wrote a signed URL's query out.
  it('is a TypeError that carries neither the value nor its query, in the message or the cause', () => {
    let caught: unknown;
    try {
      createGuard({
        audience: AUDIENCE,
        issuers: [{ issuer: ISSUER, jwksUri: `/jwks?${SECRET_QUERY}`, algorithms: ['ES256'] }],
      });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(TypeError);
    expect((caught as Error).message).toMatch(/jwksUri must be an absolute URL/);
    expect(inspect(caught, { depth: 5 })).not.toMatch(/topsecret|hunter2/);
  });
});

describe('a jwksUri given as a URL object', () => {
  // Was a regression of the parse check above: a JavaScript caller passing `new URL(...)` (the type
  // says string, but it worked before) got "must be an absolute URL". It is taken as its href.
  it('is taken as its href', () => {
    const make = (jwksUri: unknown) => () =>
      createGuard({
        audience: AUDIENCE,
        issuers: [{ issuer: ISSUER, jwksUri: jwksUri as string, algorithms: ['ES256'] }],
      });
    expect(make(new URL('https://id.example/jwks'))).not.toThrow();
    expect(make(new URL('http://id.example/jwks'))).toThrow(/https/);
    expect(make(42)).toThrow(/jwksUri must be an absolute URL/);
  });
});
