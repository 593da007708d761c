// Audit of the guard half of docs/migrating.md: for each library a user comes from (express-jwt with
// jwks-rsa, express-oauth2-jwt-bearer, @fastify/jwt), a real server with that library and one with
// the guard configured as the page's options table says, fed the same tokens. Each test asserts the
// status on both sides; where the two decide differently, or an operator would see a difference (a
// JWKS fetch, a challenge), the page's "Behaviour differences that matter" table of that library must
// have the row named here, and every row of that table must be observed by a test below. The keys
// are served as a JWKS over http on 127.0.0.1; the clock is Date, faked for every library at once
// (jsonwebtoken, fast-jwt and jose read Date.now; the guard takes `now: Date.now`).
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fastifyJwt from '@fastify/jwt';
import { authorize, guard } from '@idem/express';
import { authPlugin, guard as fastifyGuard } from '@idem/fastify';
import { policy, requireScopes } from '@idem/guard';
import express from 'express';
import { expressjwt } from 'express-jwt';
import { auth, claimEquals, requiredScopes } from 'express-oauth2-jwt-bearer';
import Fastify from 'fastify';
import { exportJWK, exportSPKI, generateKeyPair, SignJWT } from 'jose';
import jwksRsa from 'jwks-rsa';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';
import { freePort } from './free-port.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'migrating.md'), 'utf8');

/** The first cells of the "Behaviour differences that matter" table under the page's `## heading`. */
function differenceRows(heading: string): string[] {
  const start = page.indexOf(`\n## ${heading}\n`);
  if (start === -1) throw new Error(`docs/migrating.md has no section "## ${heading}": revisit this audit`);
  const end = page.indexOf('\n## ', start + 1);
  const section = page.slice(start, end === -1 ? undefined : end);
  const table = section.slice(section.indexOf('### Behaviour differences that matter'));
  return table
    .split('\n')
    .filter((line) => line.startsWith('| ') && !line.startsWith('| |') && !line.startsWith('|---'))
    .map((line) => line.split('|')[1]?.trim() ?? '');
}

/** The whole row of that table whose first cell is `label`. */
function differenceRow(heading: string, label: string): string {
  const start = page.indexOf(`\n## ${heading}\n`);
  const end = page.indexOf('\n## ', start + 1);
  const line = page
    .slice(start, end === -1 ? undefined : end)
    .split('\n')
    .find((text) => text.startsWith(`| ${label} |`));
  if (line === undefined) throw new Error(`"${heading}" has no difference row "${label}": revisit this audit`);
  return line;
}

const T0 = Date.UTC(2026, 11, 1, 12, 0, 0);
const now = T0 / 1000;
const ISS = 'https://id.example/';
const AUD = 'https://api.example';

const rsa = await generateKeyPair('RS256', { extractable: true });
const ec = await generateKeyPair('ES256', { extractable: true });
const unpublished = await generateKeyPair('RS256', { extractable: true });
const rsaPem = await exportSPKI(rsa.publicKey);
const keySet = {
  keys: [
    { ...(await exportJWK(rsa.publicKey)), kid: 'rsa-1', alg: 'RS256', use: 'sig' },
    { ...(await exportJWK(ec.publicKey)), kid: 'ec-1', alg: 'ES256', use: 'sig' },
  ],
};

// The JWKS, with a fetch counter per path: each server of a pair has its own path.
const fetches = new Map<string, number>();
const jwksServer = http.createServer((req, res) => {
  fetches.set(req.url ?? '', (fetches.get(req.url ?? '') ?? 0) + 1);
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(keySet));
});
let jwksBase = '';
const jwksUri = (name: string) => `${jwksBase}/${name}`;
const fetched = (name: string) => fetches.get(`/${name}`) ?? 0;

const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');
type Claims = Record<string, unknown>;

/** An access token; a claim or header parameter given as `null` is left out. */
async function mint(options: { key?: CryptoKey; header?: Claims; claims?: Claims } = {}): Promise<string> {
  const header: Claims = { alg: 'RS256', kid: 'rsa-1', typ: 'at+jwt', ...options.header };
  const claims: Claims = {
    iss: ISS,
    aud: AUD,
    sub: 'user-1',
    iat: now,
    exp: now + 600,
    scope: 'orders:read',
    ...options.claims,
  };
  for (const bag of [header, claims]) for (const name of Object.keys(bag)) if (bag[name] === null) delete bag[name];
  return new SignJWT(claims).setProtectedHeader(header as { alg: string }).sign(options.key ?? rsa.privateKey);
}

function unsigned(claims: Claims): string {
  return `${b64({ alg: 'none', typ: 'at+jwt' })}.${b64({ iss: ISS, aud: AUD, sub: 'user-1', exp: now + 600, ...claims })}.`;
}

// HS256 whose HMAC key is the issuer's public key PEM (CVE-2015-9235), with the RSA key's kid.
function hmacWithPublicKey(): string {
  const input = `${b64({ alg: 'HS256', kid: 'rsa-1', typ: 'at+jwt' })}.${b64({ iss: ISS, aud: AUD, sub: 'user-1', exp: now + 600 })}`;
  return `${input}.${createHmac('sha256', rsaPem).update(input).digest('base64url')}`;
}

interface Probe {
  headers?: Record<string, string>;
  query?: string;
  method?: string;
}

let tokens: Record<string, string> = {};
// The same set for every library. `wrongTyp` is what most identity providers issue (`typ: JWT`).
async function tokenSet(): Promise<Record<string, string>> {
  return {
    valid: await mint(),
    validEs256: await mint({ key: ec.privateKey, header: { alg: 'ES256', kid: 'ec-1' } }),
    expired: await mint({ claims: { exp: now - 60 } }),
    expiredWithinTolerance: await mint({ claims: { exp: now - 3 } }),
    notYetValid: await mint({ claims: { nbf: now + 60 } }),
    wrongAudience: await mint({ claims: { aud: 'https://other.example' } }),
    wrongIssuer: await mint({ claims: { iss: 'https://evil.example/' } }),
    algNone: unsigned({}),
    hs256WithPublicKey: hmacWithPublicKey(),
    unknownKid: await mint({ key: unpublished.privateKey, header: { kid: 'rsa-2' } }),
    wrongTyp: await mint({ header: { typ: 'JWT' } }),
    noExp: await mint({ claims: { exp: null } }),
    noSub: await mint({ claims: { sub: null } }),
    iatInFuture: await mint({ claims: { iat: now + 600 } }),
  };
}

const probes = (): Record<string, Probe> => ({
  ...Object.fromEntries(
    Object.entries(tokens).map(([name, token]) => [name, { headers: { authorization: `Bearer ${token}` } }]),
  ),
  missing: {},
  queryString: { query: `?access_token=${tokens.valid}` },
  basicScheme: { headers: { authorization: 'Basic dXNlcjpwYXNzd29yZA==' } },
  corsPreflight: {
    method: 'OPTIONS',
    headers: {
      origin: 'https://app.example',
      'access-control-request-method': 'GET',
      'access-control-request-headers': 'authorization',
    },
  },
});

interface Answer {
  status: number;
  challenge: string | null;
  type: string | null;
  body: string;
}

async function ask(base: string, probe: Probe, path = '/orders'): Promise<Answer> {
  const answer = await fetch(`${base}${path}${probe.query ?? ''}`, {
    method: probe.method ?? 'GET',
    headers: probe.headers ?? {},
  });
  return {
    status: answer.status,
    challenge: answer.headers.get('www-authenticate'),
    type: answer.headers.get('content-type'),
    body: await answer.text(),
  };
}

const closers: Array<() => Promise<unknown>> = [];

/** A JWKS URL on a loopback port nobody listens on: every fetch is refused at once. */
async function deadJwksUri(): Promise<string> {
  return `http://127.0.0.1:${await freePort()}/jwks`;
}
async function listenExpress(app: express.Express): Promise<string> {
  const { url, close } = await listen(http.createServer(app));
  closers.push(close);
  return url;
}
/**
 * Their middleware and the guard, each in an Express app whose GET /orders answers `{}` behind it
 * (mounted app-wide or on the route); the two base URLs.
 */
async function ordersPair(
  mount: 'app-wide' | 'route',
  theirs: express.RequestHandler,
  ours: express.RequestHandler,
): Promise<[string, string]> {
  const urls: string[] = [];
  for (const middleware of [theirs, ours]) {
    const app = express();
    const answer: express.RequestHandler = (_req, res) => {
      res.json({});
    };
    if (mount === 'app-wide') app.use(middleware).get('/orders', answer);
    else app.get('/orders', middleware, answer);
    urls.push(await listenExpress(app));
  }
  return urls as [string, string];
}
async function listenFastify(app: ReturnType<typeof Fastify>): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' });
  closers.push(() => app.close());
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
}

beforeAll(async () => {
  // Only Date: sockets and timers run as usual.
  vi.useFakeTimers({ toFake: ['Date'], now: T0 });
  const jwks = await listen(jwksServer);
  jwksBase = jwks.url;
  closers.push(jwks.close);
  tokens = await tokenSet();
});

afterAll(async () => {
  for (const close of closers) await close();
  vi.useRealTimers();
});

/** What is expected of one probe: both statuses, and the page's row when they differ. */
interface Expected {
  theirs: number;
  ours: number;
  row?: string;
  /** The guard's problem `code`, where the page names it. */
  code?: string;
}

/**
 * Sends every probe to both servers, checks each status (and the guard's `code` where given) against
 * `table`, and checks that a probe answered with different statuses names a difference row of the
 * page. Returns the rows used.
 */
async function sideBySide(
  heading: string,
  theirs: string,
  ours: string,
  table: Record<string, Expected>,
): Promise<Set<string>> {
  const used = new Set<string>();
  const observed: Record<string, { theirs: number; ours: number; code?: string }> = {};
  for (const [name, probe] of Object.entries(probes())) {
    const answer = await ask(ours, probe);
    observed[name] = { theirs: (await ask(theirs, probe)).status, ours: answer.status };
    if (table[name]?.code !== undefined) observed[name].code = JSON.parse(answer.body).code;
  }
  expect(observed).toEqual(
    Object.fromEntries(
      Object.entries(table).map(([n, e]) => [
        n,
        { theirs: e.theirs, ours: e.ours, ...(e.code === undefined ? {} : { code: e.code }) },
      ]),
    ),
  );
  for (const [name, expected] of Object.entries(table)) {
    // A different decision, or the same refusal with another status: the page must say so.
    if (expected.theirs !== expected.ours)
      expect(expected.row, `${name}: the page must name this difference`).toBeDefined();
    if (expected.row !== undefined) {
      differenceRow(heading, expected.row);
      used.add(expected.row);
    }
  }
  return used;
}

const ourStatuses = {
  valid: 200,
  validEs256: 200,
  expired: 401,
  expiredWithinTolerance: 200,
  notYetValid: 401,
  wrongAudience: 401,
  wrongIssuer: 401,
  algNone: 401,
  hs256WithPublicKey: 401,
  unknownKid: 401,
  wrongTyp: 401,
  noExp: 401,
  noSub: 401,
  iatInFuture: 401,
  missing: 401,
  queryString: 401,
  basicScheme: 401,
  corsPreflight: 401,
} as const;

describe('docs/migrating.md, From express-jwt and jwks-rsa', () => {
  const heading = 'From express-jwt and jwks-rsa';
  const used = new Set<string>();
  let theirs = '';
  let ours = '';

  beforeAll(async () => {
    // Mounted app-wide, as both libraries' READMEs show.
    const before = express();
    before.use(
      expressjwt({
        secret: jwksRsa.expressJwtSecret({ jwksUri: jwksUri('express-jwt') }) as never,
        algorithms: ['RS256', 'ES256'],
        issuer: ISS,
        audience: AUD,
      }),
    );
    before.get('/orders', (req, res) => {
      res.json((req as unknown as { auth: Claims }).auth);
    });
    // No error handler of the app's own: Express's default answers the library's errors.
    theirs = await listenExpress(before);

    const after = express();
    after.use(
      guard({
        audience: AUD,
        issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-express-jwt'), algorithms: ['RS256', 'ES256'] }],
        now: Date.now,
      }),
    );
    after.get('/orders', (req, res) => {
      res.json({ sub: req.auth?.sub, scope: [...(req.auth?.scope ?? [])], claims: req.auth?.claims });
    });
    ours = await listenExpress(after);
  });

  it('the same tokens: each side decides as the page says', async () => {
    const table: Record<string, Expected> = {
      ...Object.fromEntries(Object.entries(ourStatuses).map(([n, s]) => [n, { theirs: s, ours: s }])),
      expiredWithinTolerance: { theirs: 401, ours: 200, row: 'Expired by less than 5 s' },
      wrongTyp: { theirs: 200, ours: 401, row: '`typ`', code: 'type_invalid' },
      noExp: { theirs: 200, ours: 401, row: 'No `exp`', code: 'claim_invalid' },
      noSub: { theirs: 200, ours: 401, row: 'No `sub`', code: 'claim_invalid' },
      iatInFuture: { theirs: 200, ours: 401, row: '`iat` in the future', code: 'token_issued_in_future' },
      // express-jwt lets the preflight past; Express answers OPTIONS itself (200, `Allow: GET, HEAD`).
      corsPreflight: { theirs: 200, ours: 401, row: 'CORS preflight' },
    };
    for (const row of await sideBySide(heading, theirs, ours, table)) used.add(row);
  });

  it('a refusal: their error goes to next(err), without a challenge; the guard answers problem+json with one', async () => {
    const probe = { headers: { authorization: `Bearer ${tokens.expired}` } };
    const before = await ask(theirs, probe);
    expect(before).toMatchObject({ status: 401, challenge: null });
    expect(before.type).toMatch(/^text\/html/); // Express's default error handler
    const after = await ask(ours, probe);
    expect(after).toMatchObject({
      status: 401,
      challenge: 'Bearer realm="api", error="invalid_token", error_description="The access token expired"',
      type: 'application/problem+json',
    });
    expect(JSON.parse(after.body)).toMatchObject({ code: 'token_expired', status: 401 });
    const missing = await ask(ours, {});
    expect(missing.challenge).toBe('Bearer realm="api"');
    differenceRow(heading, 'A refused request');
    used.add('A refused request');
  });

  it('req.auth: their payload; the guard a Principal with the claims under claims', async () => {
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    const before = JSON.parse((await ask(theirs, probe)).body);
    expect(before).toMatchObject({ sub: 'user-1', scope: 'orders:read' });
    const after = JSON.parse((await ask(ours, probe)).body);
    expect(after).toMatchObject({ sub: 'user-1', scope: ['orders:read'], claims: { scope: 'orders:read', iss: ISS } });
    expect(differenceRow(heading, '`req.auth`')).toMatch(/req\.auth\.claims/);
    used.add('`req.auth`');
  });

  it('an unknown kid: jwks-rsa fetches the JWKS on each one; the guard once per cooldown', async () => {
    const probe = { headers: { authorization: `Bearer ${tokens.unknownKid}` } };
    const [theirsBefore, oursBefore] = [fetched('express-jwt'), fetched('idem-express-jwt')];
    for (let i = 0; i < 3; i++) {
      expect((await ask(theirs, probe)).status).toBe(401);
      expect((await ask(ours, probe)).status).toBe(401);
    }
    expect(fetched('express-jwt') - theirsBefore).toBe(3);
    expect(fetched('idem-express-jwt') - oursBefore).toBe(0); // within the cooldown of the first fetch
    vi.setSystemTime(T0 + 31_000);
    try {
      for (let i = 0; i < 3; i++) expect((await ask(ours, probe)).status).toBe(401);
      expect(fetched('idem-express-jwt') - oursBefore).toBe(1);
    } finally {
      vi.setSystemTime(T0);
    }
    expect(differenceRow(heading, 'Unknown `kid`')).toMatch(/every request/);
    used.add('Unknown `kid`');
  });

  it('the options the table maps: clockTolerance, maxAge, subject, credentialsRequired', async () => {
    const before = express();
    before.get(
      '/orders',
      expressjwt({
        secret: jwksRsa.expressJwtSecret({ jwksUri: jwksUri('express-jwt-options') }) as never,
        algorithms: ['RS256'],
        issuer: ISS,
        audience: AUD,
        clockTolerance: 5,
        maxAge: '1h',
        subject: 'user-1',
        credentialsRequired: false,
      }),
      (req, res) => {
        res.json({ anonymous: (req as unknown as { auth?: Claims }).auth === undefined });
      },
    );
    const after = express();
    after.get(
      '/orders',
      guard(
        {
          audience: AUD,
          issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-express-jwt-options'), algorithms: ['RS256'] }],
          clockTolerance: 5,
          maxTokenAge: 3600,
          claimValues: { sub: 'user-1' },
          now: Date.now,
        },
        { optional: true },
      ),
      (req, res) => {
        res.json({ anonymous: req.auth === undefined });
      },
    );
    const [b, a] = [await listenExpress(before), await listenExpress(after)];
    const cases: Record<string, { token: string | undefined; status: number }> = {
      'expired 3 s ago, tolerance 5': { token: tokens.expiredWithinTolerance, status: 200 },
      'expired 60 s ago': { token: tokens.expired, status: 401 },
      'issued 2 h ago': { token: await mint({ claims: { iat: now - 7200 } }), status: 401 },
      'another subject': { token: await mint({ claims: { sub: 'user-2' } }), status: 401 },
      'no token at all': { token: undefined, status: 200 },
      'ES256, not listed': { token: tokens.validEs256, status: 401 },
    };
    for (const [name, { token, status }] of Object.entries(cases)) {
      const probe = token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } };
      expect([name, (await ask(b, probe)).status]).toEqual([name, status]);
      expect([name, (await ask(a, probe)).status]).toEqual([name, status]);
    }
    // The options row of credentialsRequired: another scheme is not "no credentials" to the guard.
    const basic = { headers: { authorization: 'Basic dXNlcjpwYXNzd29yZA==' } };
    expect(await ask(b, basic)).toMatchObject({ status: 200, body: '{"anonymous":true}' });
    expect((await ask(a, basic)).status).toBe(401);
  });

  it("a string secret is the issuer's secret (HS256)", async () => {
    const secret = 'a-shared-secret-of-at-least-32-bytes!';
    const [b, a] = await ordersPair(
      'app-wide',
      expressjwt({ secret, algorithms: ['HS256'], issuer: ISS, audience: AUD }),
      guard({ audience: AUD, issuers: [{ issuer: ISS, secret }], now: Date.now }),
    );
    const hs = await new SignJWT({ iss: ISS, aud: AUD, sub: 'user-1', iat: now, exp: now + 600 })
      .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
      .sign(new TextEncoder().encode(secret));
    for (const [token, status] of [
      [hs, 200],
      [tokens.valid ?? '', 401],
    ] as const) {
      const probe = { headers: { authorization: `Bearer ${token}` } };
      expect((await ask(b, probe)).status).toBe(status);
      expect((await ask(a, probe)).status).toBe(status);
    }
  });

  it('the JWKS endpoint unreachable: express-jwt answers 500, the guard 401 keys_unavailable', async () => {
    const dead = await deadJwksUri();
    const [b, a] = await ordersPair(
      'app-wide',
      expressjwt({
        secret: jwksRsa.expressJwtSecret({ jwksUri: dead }) as never,
        algorithms: ['RS256'],
        issuer: ISS,
        audience: AUD,
      }),
      guard({ audience: AUD, issuers: [{ issuer: ISS, jwksUri: dead, algorithms: ['RS256'] }], now: Date.now }),
    );
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    expect((await ask(b, probe)).status).toBe(500);
    const ours = await ask(a, probe);
    expect(ours.status).toBe(401);
    expect(JSON.parse(ours.body)).toMatchObject({ code: 'keys_unavailable', retryable: true });
    differenceRow(heading, 'JWKS endpoint unreachable');
    used.add('JWKS endpoint unreachable');
  });

  it('every difference row of the page was observed above', () => {
    expect(new Set(differenceRows(heading))).toEqual(used);
  });
});

describe('docs/migrating.md, From express-oauth2-jwt-bearer', () => {
  const heading = 'From express-oauth2-jwt-bearer';
  const used = new Set<string>();
  let theirs = '';
  let ours = '';

  beforeAll(async () => {
    const before = express();
    before.use(auth({ issuer: ISS, audience: AUD, jwksUri: jwksUri('a0') }));
    before.get('/orders', (req, res) => {
      // Their `req.auth` ({ payload, header, token }); the type here is the guard's, which both declare.
      res.json((req as unknown as { auth?: { payload: Claims } }).auth?.payload);
    });
    theirs = await listenExpress(before);
    const after = express();
    after.use(guard({ audience: AUD, issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0') }], now: Date.now }));
    after.get('/orders', (req, res) => {
      res.json({ sub: req.auth?.sub });
    });
    ours = await listenExpress(after);
  });

  it('the same tokens: each side decides as the page says', async () => {
    const table: Record<string, Expected> = {
      ...Object.fromEntries(Object.entries(ourStatuses).map(([n, s]) => [n, { theirs: s, ours: s }])),
      wrongTyp: { theirs: 200, ours: 401, row: '`typ`', code: 'type_invalid' },
      noSub: { theirs: 200, ours: 401, row: 'No `sub`', code: 'claim_invalid' },
      iatInFuture: { theirs: 200, ours: 401, row: '`iat` in the future', code: 'token_issued_in_future' },
      queryString: { theirs: 200, ours: 401, row: 'Token in the query string', code: 'token_missing' },
      basicScheme: { theirs: 400, ours: 401, row: 'Another scheme (`Basic`)', code: 'token_missing' },
    };
    for (const row of await sideBySide(heading, theirs, ours, table)) used.add(row);
  });

  it("a refusal: both send a challenge; theirs has the library's text and a DPoP offer, the body is Express's", async () => {
    const probe = { headers: { authorization: `Bearer ${tokens.expired}` } };
    const before = await ask(theirs, probe);
    expect(before.status).toBe(401);
    expect(before.challenge).toMatch(
      /^Bearer realm="api", error="invalid_token", error_description="'exp' claim timestamp check failed", DPoP algs="/,
    );
    expect(before.type).toMatch(/^text\/html/);
    const after = await ask(ours, probe);
    expect(after.challenge).toBe(
      'Bearer realm="api", error="invalid_token", error_description="The access token expired"',
    );
    expect(after.type).toBe('application/problem+json');
    const basic = await ask(theirs, { headers: { authorization: 'Basic dXNlcjpwYXNzd29yZA==' } });
    expect(basic.status).toBe(400);
    expect(basic.challenge).toMatch(/^Bearer realm="api", DPoP algs="/); // no `error` attribute
    expect(differenceRow(heading, 'A refused request')).toMatch(/DPoP/);
    used.add('A refused request');
  });

  it('req.auth: their { payload, header, token }; the guard a Principal', async () => {
    expect(differenceRow(heading, '`req.auth`')).toMatch(/req\.auth\.payload/);
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    expect(JSON.parse((await ask(theirs, probe)).body)).toMatchObject({ sub: 'user-1' });
    expect(JSON.parse((await ask(ours, probe)).body)).toEqual({ sub: 'user-1' });
    used.add('`req.auth`');
  });

  it('authRequired: false lets a bad token through as anonymous; optional: true refuses it', async () => {
    const before = express();
    before.get(
      '/orders',
      auth({ issuer: ISS, audience: AUD, jwksUri: jwksUri('a0'), authRequired: false }),
      (req, res) => {
        res.json({ anonymous: req.auth === undefined });
      },
    );
    const after = express();
    after.get(
      '/orders',
      guard(
        { audience: AUD, issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0') }], now: Date.now },
        { optional: true },
      ),
      (req, res) => {
        res.json({ anonymous: req.auth === undefined });
      },
    );
    const [b, a] = [await listenExpress(before), await listenExpress(after)];
    const bad = { headers: { authorization: `Bearer ${tokens.expired}` } };
    expect(await ask(b, bad)).toMatchObject({ status: 200, body: '{"anonymous":true}' });
    expect((await ask(a, bad)).status).toBe(401);
    expect(await ask(b, {})).toMatchObject({ status: 200, body: '{"anonymous":true}' });
    expect(await ask(a, {})).toMatchObject({ status: 200, body: '{"anonymous":true}' });
    differenceRow(heading, '`authRequired: false`');
    used.add('`authRequired: false`');
  });

  it('requiredScopes is requireScopes (403 with scope=); claimEquals is 401 where a policy is 403', async () => {
    const before = express();
    const a0 = auth({ issuer: ISS, audience: AUD, jwksUri: jwksUri('a0') });
    before.get('/scoped', a0, requiredScopes('orders:write'), (_req, res) => {
      res.json({});
    });
    before.get('/claimed', a0, claimEquals('tenant', 't1'), (_req, res) => {
      res.json({});
    });
    const after = express();
    const edge = guard({ audience: AUD, issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0') }], now: Date.now });
    after.get('/scoped', edge, authorize(requireScopes('orders:write')), (_req, res) => {
      res.json({});
    });
    after.get('/claimed', edge, authorize(policy((p) => p.claims.tenant === 't1')), (_req, res) => {
      res.json({});
    });
    const [b, a] = [await listenExpress(before), await listenExpress(after)];
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    const scopedBefore = await ask(b, probe, '/scoped');
    const scopedAfter = await ask(a, probe, '/scoped');
    expect(scopedBefore.status).toBe(403);
    expect(scopedAfter.status).toBe(403);
    expect(scopedBefore.challenge).toMatch(/error="insufficient_scope".*scope="orders:write"/);
    expect(scopedAfter.challenge).toMatch(/error="insufficient_scope".*scope="orders:write"/);
    const claimedBefore = await ask(b, probe, '/claimed');
    const claimedAfter = await ask(a, probe, '/claimed');
    expect([claimedBefore.status, claimedBefore.challenge]).toEqual([
      401,
      expect.stringContaining('error="invalid_token"'),
    ]);
    expect([claimedAfter.status, claimedAfter.challenge]).toEqual([
      403,
      expect.stringContaining('error="insufficient_scope"'),
    ]);
    differenceRow(heading, 'A claim check');
    used.add('A claim check');
  });

  it('strict: true is the default typ plus requiredClaims; clockTolerance and maxTokenAge alike', async () => {
    const [b, a] = await ordersPair(
      'route',
      auth({ issuer: ISS, audience: AUD, jwksUri: jwksUri('a0'), strict: true, maxTokenAge: 3600 }),
      guard({
        audience: AUD,
        issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0') }],
        requiredClaims: ['client_id', 'jti', 'iat'],
        maxTokenAge: 3600,
        now: Date.now,
      }),
    );
    const strict = { client_id: 'app-1', jti: 'j-1' };
    const cases: Record<string, { token: string; status: number }> = {
      'RFC 9068 token': { token: await mint({ claims: strict }), status: 200 },
      'typ JWT': { token: await mint({ header: { typ: 'JWT' }, claims: strict }), status: 401 },
      'no client_id': { token: await mint({ claims: { jti: 'j-1' } }), status: 401 },
      'no jti': { token: await mint({ claims: { client_id: 'app-1' } }), status: 401 },
      'expired 3 s ago (tolerance 5 on both)': {
        token: await mint({ claims: { ...strict, exp: now - 3 } }),
        status: 200,
      },
      'issued 2 h ago': { token: await mint({ claims: { ...strict, iat: now - 7200 } }), status: 401 },
    };
    for (const [name, { token, status }] of Object.entries(cases)) {
      const probe = { headers: { authorization: `Bearer ${token}` } };
      expect([name, (await ask(b, probe)).status]).toEqual([name, status]);
      expect([name, (await ask(a, probe)).status]).toEqual([name, status]);
    }
  });

  it("strict: false takes Auth0's typ: JWT tokens; typ: ['at+jwt', 'jwt'] does too", async () => {
    const after = express();
    after.use(
      guard({
        audience: AUD,
        issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0'), typ: ['at+jwt', 'jwt'] }],
        now: Date.now,
      }),
    );
    after.get('/orders', (_req, res) => {
      res.json({});
    });
    const a = await listenExpress(after);
    for (const token of [tokens.wrongTyp, tokens.valid]) {
      const probe = { headers: { authorization: `Bearer ${token}` } };
      expect((await ask(theirs, probe)).status).toBe(200);
      expect((await ask(a, probe)).status).toBe(200);
    }
  });

  it('the JWKS endpoint unreachable: both refuse with 401', async () => {
    const dead = await deadJwksUri();
    const [b, a] = await ordersPair(
      'app-wide',
      auth({ issuer: ISS, audience: AUD, jwksUri: dead }),
      guard({ audience: AUD, issuers: [{ issuer: ISS, jwksUri: dead }], now: Date.now }),
    );
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    const before401 = await ask(b, probe);
    expect([before401.status, before401.challenge]).toEqual([401, expect.stringContaining('invalid_token')]);
    expect((await ask(a, probe)).status).toBe(401);
  });

  it('tokenSigningAlg is one algorithm; the JWKS: 30 s cooldown on an unknown kid, 10 min cache, on both', async () => {
    const [b, a] = await ordersPair(
      'route',
      auth({ issuer: ISS, audience: AUD, jwksUri: jwksUri('a0-jwks'), tokenSigningAlg: 'RS256' }),
      guard({
        audience: AUD,
        issuers: [{ issuer: ISS, jwksUri: jwksUri('idem-a0-jwks'), algorithms: ['RS256'] }],
        now: Date.now,
      }),
    );
    const long = await mint({ claims: { exp: now + 7200 } });
    const send = async (token: string, status: number) => {
      const probe = { headers: { authorization: `Bearer ${token}` } };
      expect((await ask(b, probe)).status).toBe(status);
      expect((await ask(a, probe)).status).toBe(status);
    };
    const counts = () => [fetched('a0-jwks'), fetched('idem-a0-jwks')];
    try {
      await send(long, 200);
      expect(counts()).toEqual([1, 1]);
      await send(tokens.validEs256 ?? '', 401); // not the one algorithm
      await send(tokens.unknownKid ?? '', 401);
      expect(counts()).toEqual([1, 1]); // within the cooldown
      vi.setSystemTime(T0 + 31_000);
      await send(tokens.unknownKid ?? '', 401);
      expect(counts()).toEqual([2, 2]);
      vi.setSystemTime(T0 + 31_000 + 601_000);
      await send(long, 200);
      expect(counts()).toEqual([3, 3]); // the set's 600 s are over
    } finally {
      vi.setSystemTime(T0);
    }
  });

  it('every difference row of the page was observed above', () => {
    expect(new Set(differenceRows(heading))).toEqual(used);
  });
});

describe('docs/migrating.md, From @fastify/jwt', () => {
  const heading = 'From @fastify/jwt';
  const unmapped = 'Errors @fastify/jwt does not map';
  const used = new Set<string>();
  let theirs = '';
  let ours = '';

  beforeAll(async () => {
    const before = Fastify();
    await before.register(fastifyJwt, {
      secret: { public: rsaPem, private: 'unused' },
      verify: { allowedIss: ISS, allowedAud: AUD },
    });
    before.addHook('onRequest', async (request) => {
      await request.jwtVerify();
    });
    before.get('/orders', async (request) => request.user);
    theirs = await listenFastify(before);

    const after = Fastify();
    await after.register(authPlugin);
    after.addHook(
      'onRequest',
      fastifyGuard({ audience: AUD, issuers: [{ issuer: ISS, publicKeys: [rsaPem] }], now: Date.now }),
    );
    after.get('/orders', async (request) => ({ sub: request.auth?.sub, claims: request.auth?.claims }));
    ours = await listenFastify(after);
  });

  it('the same tokens: each side decides as the page says', async () => {
    const table: Record<string, Expected> = {
      ...Object.fromEntries(Object.entries(ourStatuses).map(([n, s]) => [n, { theirs: s, ours: s }])),
      // One RSA public key on each side: the ES256 token has no key here (the guard's JWKS twin
      // would take it, but @fastify/jwt reads none without get-jwks).
      validEs256: { theirs: 500, ours: 401, row: unmapped, code: 'algorithm_not_allowed' },
      hs256WithPublicKey: { theirs: 500, ours: 401, row: unmapped, code: 'algorithm_not_allowed' },
      notYetValid: { theirs: 500, ours: 401, row: unmapped, code: 'token_not_yet_valid' },
      expiredWithinTolerance: { theirs: 401, ours: 200, row: 'Expired by less than 5 s' },
      wrongTyp: { theirs: 200, ours: 401, row: '`typ`', code: 'type_invalid' },
      noExp: { theirs: 200, ours: 401, row: 'No `exp`', code: 'claim_invalid' },
      noSub: { theirs: 200, ours: 401, row: 'No `sub`', code: 'claim_invalid' },
      iatInFuture: { theirs: 200, ours: 401, row: '`iat` in the future', code: 'token_issued_in_future' },
      // A hook on every request, an OPTIONS route on neither: both refuse the preflight.
    };
    for (const row of await sideBySide(heading, theirs, ours, table)) used.add(row);
  });

  it('a refusal: their FST_JWT_* JSON without a challenge; the guard problem+json with one', async () => {
    const before = await ask(theirs, { headers: { authorization: `Bearer ${tokens.expired}` } });
    expect(before).toMatchObject({ status: 401, challenge: null });
    expect(JSON.parse(before.body)).toMatchObject({ statusCode: 401, code: 'FST_JWT_AUTHORIZATION_TOKEN_EXPIRED' });
    const after = await ask(ours, { headers: { authorization: `Bearer ${tokens.expired}` } });
    expect(after.type).toBe('application/problem+json');
    expect(after.challenge).toMatch(/^Bearer realm="api", error="invalid_token"/);
    differenceRow(heading, 'A refused request');
    used.add('A refused request');
  });

  it('request.user is the payload; request.auth a Principal', async () => {
    const probe = { headers: { authorization: `Bearer ${tokens.valid}` } };
    expect(JSON.parse((await ask(theirs, probe)).body)).toMatchObject({ sub: 'user-1', scope: 'orders:read' });
    expect(JSON.parse((await ask(ours, probe)).body)).toMatchObject({
      sub: 'user-1',
      claims: { scope: 'orders:read' },
    });
    expect(differenceRow(heading, '`request.user`')).toMatch(/request\.auth/);
    used.add('`request.user`');
  });

  it('the options the table maps: clockTolerance (ms), maxAge (ms), checkTyp, requiredClaims, allowedSub', async () => {
    const before = Fastify();
    await before.register(fastifyJwt, {
      secret: { public: rsaPem, private: 'unused' },
      verify: {
        algorithms: ['RS256'],
        allowedIss: ISS,
        allowedAud: AUD,
        allowedSub: 'user-1',
        clockTolerance: 5000,
        maxAge: 3600, // seconds as a number here (or '1h'); clockTolerance is milliseconds
        checkTyp: 'at+jwt',
        requiredClaims: ['jti'],
      },
    });
    before.addHook('onRequest', async (request) => {
      await request.jwtVerify();
    });
    before.get('/orders', async () => ({}));
    const after = Fastify();
    await after.register(authPlugin);
    after.addHook(
      'onRequest',
      fastifyGuard({
        audience: AUD,
        issuers: [{ issuer: ISS, publicKeys: [rsaPem], algorithms: ['RS256'] }],
        claimValues: { sub: 'user-1' },
        clockTolerance: 5,
        maxTokenAge: 3600,
        typ: ['at+jwt'],
        requiredClaims: ['jti'],
        now: Date.now,
      }),
    );
    after.get('/orders', async () => ({}));
    const [b, a] = [await listenFastify(before), await listenFastify(after)];
    const cases: Record<string, { token: string; theirs: number; ours: number }> = {
      'with a jti': { token: await mint({ claims: { jti: 'j-1' } }), theirs: 200, ours: 200 },
      'expired 3 s ago, tolerance 5 s': {
        token: await mint({ claims: { jti: 'j-1', exp: now - 3 } }),
        theirs: 200,
        ours: 200,
      },
      'issued 2 h ago': { token: await mint({ claims: { jti: 'j-1', iat: now - 7200 } }), theirs: 401, ours: 401 },
      // Refused on both sides; fast-jwt's FAST_JWT_INVALID_TYPE is one of the errors @fastify/jwt does not map.
      'typ JWT': { token: await mint({ header: { typ: 'JWT' }, claims: { jti: 'j-1' } }), theirs: 500, ours: 401 },
      'no jti': { token: tokens.valid ?? '', theirs: 401, ours: 401 },
      'another subject': { token: await mint({ claims: { jti: 'j-1', sub: 'user-2' } }), theirs: 401, ours: 401 },
    };
    for (const [name, { token, theirs: before, ours: after }] of Object.entries(cases)) {
      const probe = { headers: { authorization: `Bearer ${token}` } };
      expect([name, (await ask(b, probe)).status]).toEqual([name, before]);
      expect([name, (await ask(a, probe)).status]).toEqual([name, after]);
    }
    expect(differenceRow(heading, unmapped)).toMatch(/checkTyp/);
    used.add(unmapped);
  });

  it('every difference row of the page was observed above', () => {
    expect(new Set(differenceRows(heading))).toEqual(used);
  });
});
