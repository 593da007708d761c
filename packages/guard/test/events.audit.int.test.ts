import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type GuardEvent } from '../src/index.js';
import { type Handler, handlerServer } from './support/handler-server.js';

// Audit (branch audit-events): what the guard's onEvent tells an on-call engineer asking "is the
// JWKS endpoint down?", over a real JWKS server on an ephemeral port. The first rows pin behaviour
// that held; the it.fails rows are defects (see their comments).

const ISS = 'https://id.example';
const AUD = 'https://api.example';

async function keyAndToken() {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' };
  const token = await new SignJWT({ sub: 'u1' })
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k1' })
    .setIssuer(ISS)
    .setAudience(AUD)
    .setIssuedAt()
    .setExpirationTime('2h')
    .sign(privateKey);
  return { jwk, token };
}

const serveKeys =
  (jwk: object): Handler =>
  (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: [jwk] }));
  };

function guardFor(jwksUri: string, onEvent: (event: GuardEvent) => unknown) {
  return createGuard({
    audience: AUD,
    cache: false,
    issuers: [{ issuer: ISS, jwksUri, algorithms: ['ES256'] }],
    onEvent: onEvent as (event: GuardEvent) => void,
  });
}

const request = (token: string) => ({ headers: { authorization: `Bearer ${token}` }, url: '/orders' });

describe('guard events: is the JWKS endpoint down?', () => {
  it('pinned: an endpoint answering 503 shows as one failed jwks-fetch (reason status, status 503) and keys_unavailable refusals, for 50 concurrent requests', async () => {
    const { token } = await keyAndToken();
    const jwks = await handlerServer((_req, res) => {
      res.writeHead(503);
      res.end();
    });
    const events: GuardEvent[] = [];
    const guard = guardFor(`http://127.0.0.1:${jwks.port}/jwks`, (e) => events.push(e));
    const results = await Promise.all(Array.from({ length: 50 }, () => guard.authenticate(request(token))));
    expect(results.every((r) => !r.ok && r.error.code === 'keys_unavailable')).toBe(true);
    const fetches = events.filter((e) => e.type === 'jwks-fetch');
    expect(fetches).toHaveLength(1);
    expect(fetches[0]).toMatchObject({ ok: false, reason: 'status', status: 503 });
    expect(events.filter((e) => e.type === 'rejected' && e.code === 'keys_unavailable')).toHaveLength(50);
    expect(JSON.stringify(events)).not.toContain(token);
  });

  it('pinned: an onEvent that throws or rejects on every event changes no authentication result', async () => {
    const { jwk, token } = await keyAndToken();
    const jwks = await handlerServer(serveKeys(jwk));
    for (const hook of [
      () => {
        throw new Error('telemetry down');
      },
      () => Promise.reject(new Error('telemetry down')),
    ]) {
      const guard = guardFor(`http://127.0.0.1:${jwks.port}/jwks`, hook);
      expect((await guard.authenticate(request(token))).ok).toBe(true);
      expect((await guard.authenticate(request('x.y.z'))).ok).toBe(false);
      expect(guard.stats().jwksFetches).toBe(1);
    }
  });

  // DEFECT. A jwksUri with credentials in it (`https://user:password@host/jwks`, a common way to
  // protect an internal JWKS) is accepted at construction, but fetch() refuses every URL with
  // credentials ("Request cannot be constructed from a URL that includes credentials"), so:
  // (1) every fetch is reported as `jwks-fetch { ok: false, reason: 'network' }` although the
  //     endpoint is up and was never contacted: the on-call engineer is sent chasing an outage;
  // (2) each of those events carries the password in `uri`, which the OpenTelemetry recipe of
  //     docs/operations.md puts in a span attribute (`url.full`) and a warn log line ("JWKS fetch
  //     failed", `uri`), against "Events never carry a token, a claim value or a header"
  //     (docs/guard.md, Events and counters) and DESIGN.md's "Bad options throw a TypeError once,
  //     at construction".
  // Expected: createGuard refuses such a jwksUri with a TypeError (the credentials belong in
  // jwksOptions.headers), or at least events carry the URI without its userinfo.
  it('a jwksUri with user:password is refused at construction, or never reaches an event', async () => {
    const { jwk, token } = await keyAndToken();
    const jwks = await handlerServer(serveKeys(jwk));
    const events: GuardEvent[] = [];
    let guard: ReturnType<typeof createGuard>;
    try {
      guard = guardFor(`http://svc:hunter2-SECRET@127.0.0.1:${jwks.port}/jwks`, (e) => events.push(e));
    } catch (error) {
      expect(error).toBeInstanceOf(TypeError);
      return;
    }
    await guard.authenticate(request(token));
    // What actually happens: the endpoint is never asked, the fetch is reported as a network failure...
    expect(jwks.requests).toBe(0);
    // ...and the password is in the event.
    expect(JSON.stringify(events)).not.toContain('hunter2-SECRET');
    expect(events.find((e) => e.type === 'jwks-fetch')).not.toMatchObject({ ok: false, reason: 'network' });
  });
});
