// Audit of the ten package READMEs (what npm users read first): each README's code run as a reader
// pastes it, then what the text around it promises checked against what happens. A snippet is read
// from the README itself, saved as a file and imported (so the packages resolve from this checkout's
// sources); the only changes made to it are named where they are made: a server listens on port 0
// (and is exported so the test can close it), a JWKS URL points at a local key server, a Redis
// prefix starts `audit-readmes:`. The blocks are type-checked by code-blocks.test.ts and their
// install lines by packaging.audit.int.test.ts; the root README's quick start is run by
// readme-quick-start.audit.int.test.ts. None of that is repeated here.
//
// Tests marked "Was a defect" failed when the audit wrote them; the comment above each says what was wrong.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http, { type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { databaseUrl, postgresAnswers, redisAnswers, redisUrl, serviceAvailable } from '@idem/testkit';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const readme = (pkg: string): string => readFileSync(join(root, 'packages', pkg, 'README.md'), 'utf8');
/** Every package folder, each with a README. */
const packageFolders = [
  'client',
  'core',
  'express',
  'fastify',
  'guard',
  'koa',
  'postgres',
  'redis',
  'testkit',
  'webhooks',
] as const;

/** The `ts` blocks of a README, in order. */
function tsBlocks(text: string): string[] {
  return [...text.matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((match) => match[1] as string);
}

/** Replaces `from` in `code`, failing loudly when the README no longer contains it. */
function edit(code: string, from: string, to: string): string {
  if (!code.includes(from))
    throw new Error(`the snippet no longer contains ${JSON.stringify(from)}: revisit this audit`);
  return code.replace(from, to);
}

const folder = mkdtempSync(join(tmpdir(), 'idem-readmes-audit-'));
let files = 0;
/** Saves a snippet as a module and imports it, as a reader runs a pasted file. */
async function runSnippet<T>(code: string): Promise<T> {
  const file = join(folder, `snippet-${files++}.ts`);
  writeFileSync(file, code);
  return (await import(file)) as T;
}

const servers: Server[] = [];
const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup().catch(() => undefined);
  for (const server of servers) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
  rmSync(folder, { recursive: true, force: true });
});

async function listening(server: Server): Promise<string> {
  servers.push(server);
  if (!server.listening) await new Promise((resolve) => server.once('listening', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

// The identity provider the adapter READMEs name (`https://id.example`): its keys served as a JWKS on
// 127.0.0.1 (the guard allows http: for loopback), its access tokens signed here.
const ISS = 'https://id.example';
const AUD = 'https://api.example';
const signing = await generateKeyPair('ES256', { extractable: true });
const jwks = { keys: [{ ...(await exportJWK(signing.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }] };
const jwksServer = http.createServer((_req, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(jwks));
});
jwksServer.listen(0, '127.0.0.1');
const jwksUri = `${await listening(jwksServer)}/jwks`;

async function token(sub: string, scope: string): Promise<string> {
  return new SignJWT({ scope })
    .setProtectedHeader({ alg: 'ES256', kid: 'k1', typ: 'at+jwt' })
    .setIssuer(ISS)
    .setAudience(AUD)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(signing.privateKey);
}

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}
async function send(
  url: string,
  init: { method?: string; headers?: Record<string, string>; body?: string },
): Promise<Answer> {
  const response = await fetch(url, { method: 'POST', ...init });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

/**
 * The first snippet of an adapter README, run: the guard's JWKS URL pointed at the local key server
 * and the server on port 0. Returns its base URL.
 */
async function startAdapterSnippet(pkg: 'express' | 'fastify' | 'koa'): Promise<string> {
  let code = tsBlocks(readme(pkg))[0] as string;
  code = edit(code, "jwksUri: 'https://id.example/jwks'", `jwksUri: '${jwksUri}'`);
  if (pkg === 'fastify') {
    code = edit(code, 'await app.listen({ port: 3000 });', "await app.listen({ port: 0, host: '127.0.0.1' });");
    const { app } = await runSnippet<{ app: { server: Server } }>(`${code}\nexport { app };\n`);
    return listening(app.server);
  }
  code = edit(code, 'app.listen(3000);', 'export const server = app.listen(0);');
  return listening((await runSnippet<{ server: Server }>(code)).server);
}

/** What the adapter READMEs' first paragraph and snippet promise, the same on the three frameworks. */
function adapterPromises(pkg: 'express' | 'fastify' | 'koa', base: () => string): void {
  it('a POST /orders with a token and a key runs once; its retry replays it byte for byte, and names the caller and the key', async () => {
    const bearer = `Bearer ${await token('user-1', 'orders:write')}`;
    const request = {
      headers: { authorization: bearer, 'idempotency-key': `"${pkg}-k1"`, 'content-type': 'application/json' },
      body: '{"amount":100}',
    };
    const first = await send(`${base()}/orders`, request);
    const second = await send(`${base()}/orders`, request);
    expect(first.status, first.text).toBe(201);
    expect(JSON.parse(first.text)).toMatchObject({ by: 'user-1', key: `${pkg}-k1` });
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(second.status).toBe(201);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(second.text).toBe(first.text);
  });

  it('keys are scoped by the verified caller: another user with the same key gets their own execution', async () => {
    const headers = (bearer: string) => ({
      authorization: `Bearer ${bearer}`,
      'idempotency-key': `"${pkg}-shared"`,
      'content-type': 'application/json',
    });
    const a = await send(`${base()}/orders`, { headers: headers(await token('alice', 'orders:write')), body: '{}' });
    const b = await send(`${base()}/orders`, { headers: headers(await token('bob', 'orders:write')), body: '{}' });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    expect(JSON.parse(b.text)).toMatchObject({ by: 'bob' });
    expect(JSON.parse(b.text).id).not.toBe(JSON.parse(a.text).id);
  });

  it('no token is 401 with a Bearer challenge; a token without orders:write is 403 insufficient_scope; no key is 400 key_missing', async () => {
    const anonymous = await send(`${base()}/orders`, { headers: { 'idempotency-key': '"x"' }, body: '' });
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Bearer /);
    expect(anonymous.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    const reader = await send(`${base()}/orders`, {
      headers: { authorization: `Bearer ${await token('user-2', 'orders:read')}`, 'idempotency-key': '"y"' },
    });
    expect(reader.status).toBe(403);
    expect(reader.headers.get('www-authenticate')).toMatch(/error="insufficient_scope"/);
    expect(JSON.parse(reader.text)).toMatchObject({ code: 'insufficient_scope' });
    const keyless = await send(`${base()}/orders`, {
      headers: { authorization: `Bearer ${await token('user-2', 'orders:write')}` },
    });
    expect(keyless.status).toBe(400);
    expect(JSON.parse(keyless.text)).toMatchObject({ code: 'key_missing' });
  });
}

describe('packages/express/README.md', () => {
  let base = '';
  beforeAll(async () => {
    base = await startAdapterSnippet('express');
  });
  adapterPromises('express', () => base);

  const bearer = () => token('user-3', 'orders:write');

  it('a 404 no route answered is not stored: the same key again is a fresh 404, not a replay', async () => {
    const request = async () =>
      send(`${base}/nowhere`, { headers: { authorization: `Bearer ${await bearer()}`, 'idempotency-key': '"e404"' } });
    const first = await request();
    const second = await request();
    expect([first.status, second.status]).toEqual([404, 404]);
    expect(second.headers.get('idempotent-replayed')).toBeNull();
  });

  it("with idempotencyErrors() mounted, a body parser's refusal is not stored: after malformed JSON, the fixed body under the same key runs", async () => {
    const headers = {
      authorization: `Bearer ${await bearer()}`,
      'idempotency-key': '"e-json"',
      'content-type': 'application/json',
    };
    const broken = await send(`${base}/orders`, { headers, body: '{"amount":' });
    expect(broken.status).toBe(400);
    const fixed = await send(`${base}/orders`, { headers, body: '{"amount":1}' });
    expect(fixed.status, fixed.text).toBe(201);
    expect(fixed.headers.get('idempotent-replayed')).toBeNull();
  });

  it('with app.use, the operation is the concrete path as Express matches it (lower case, no trailing slash): /Orders/ is the operation of /orders', async () => {
    const headers = {
      authorization: `Bearer ${await bearer()}`,
      'idempotency-key': '"e-case"',
      'content-type': 'application/json',
    };
    const first = await send(`${base}/orders`, { headers, body: '{"amount":1}' });
    const other = await send(`${base}/Orders/`, { headers, body: '{"amount":1}' });
    expect(first.status).toBe(201);
    // The same operation (another one would run afresh: 201), with the path fingerprinted as it was
    // sent: another request under the key, 422.
    expect(other.status, other.text).toBe(422);
    expect(JSON.parse(other.text)).toMatchObject({ code: 'fingerprint_mismatch' });
  });

  it("a body over express.json()'s limit (100 kB) is a 413 that is not stored: the smaller retry under the key runs", async () => {
    const headers = {
      authorization: `Bearer ${await bearer()}`,
      'idempotency-key': '"e-limit"',
      'content-type': 'application/json',
    };
    const big = await send(`${base}/orders`, { headers, body: JSON.stringify({ pad: 'x'.repeat(200_000) }) });
    expect(big.status).toBe(413);
    const small = await send(`${base}/orders`, { headers, body: '{"amount":1}' });
    expect(small.status, small.text).toBe(201);
  });
});

describe('packages/fastify/README.md', () => {
  let base = '';
  beforeAll(async () => {
    base = await startAdapterSnippet('fastify');
  });
  adapterPromises('fastify', () => base);
});

describe('packages/koa/README.md', () => {
  let base = '';
  beforeAll(async () => {
    base = await startAdapterSnippet('koa');
  });
  adapterPromises('koa', () => base);
});

describe('packages/fastify/README.md: the paragraph after the snippet', () => {
  const text = readme('fastify');

  it('per route, `config: { idempotency: false }` leaves a route alone and an object overrides the plugin; the operation is the route template', async () => {
    const { memoryStore } = await import('@idem/core');
    const { idempotency } = await import('@idem/fastify');
    const Fastify = (await import('fastify')).default;
    const app = Fastify();
    cleanups.push(() => app.close());
    let runs = 0;
    await app.register(idempotency, { store: memoryStore(), scope: () => 'demo' });
    app.post('/free', { config: { idempotency: false } }, async () => ({ runs: ++runs }));
    app.post('/optional', { config: { idempotency: { required: false } } }, async () => ({ runs: ++runs }));
    app.post('/orders/:id/refunds', async (request) => ({ runs: ++runs, id: (request.params as { id: string }).id }));
    await app.ready();
    expect((await app.inject({ method: 'POST', url: '/free' })).statusCode).toBe(200);
    expect((await app.inject({ method: 'POST', url: '/optional' })).statusCode).toBe(200);
    const refund = (id: string) =>
      app.inject({ method: 'POST', url: `/orders/${id}/refunds`, headers: { 'idempotency-key': '"r1"' } });
    const a = await refund('a');
    const b = await refund('b');
    // One operation for every :id: another order's request under the same key is the same operation
    // with another request (its path is fingerprinted), 422; under a concrete-path operation it would run.
    expect(a.statusCode).toBe(200);
    expect(b.statusCode).toBe(422);
    expect(runs).toBe(3);
  });

  it('a misspelt per-route setting fails at startup, and bad plugin options when the plugin is registered, both with a TypeError', async () => {
    expect(text).toContain('a wrong name or value fails at');
    const { memoryStore } = await import('@idem/core');
    const { idempotency } = await import('@idem/fastify');
    const Fastify = (await import('fastify')).default;
    const wrongName = Fastify();
    await wrongName.register(idempotency, { store: memoryStore(), scope: () => 'demo' });
    const add = () =>
      wrongName.post('/x', { config: { idempotency: { retension: '48h' } as never } }, async () => ({}));
    let failure: unknown;
    try {
      add();
      await wrongName.ready();
    } catch (error) {
      failure = error;
    }
    expect(failure).toBeInstanceOf(TypeError);
    await wrongName.close().catch(() => undefined);
    const badOption = Fastify();
    await expect(badOption.register(idempotency, { store: memoryStore(), lease: 'soon' as never })).rejects.toThrow(
      TypeError,
    );
    await badOption.close().catch(() => undefined);
  });

  // Was a defect: the README listed `required`, `mintKeys` and `scope` among the per-route settings
  // and said "the names are exported as `routeSettingNames`", which holds none of those three (only
  // the settings a route overrides on an instance of its own): code that builds its route configs
  // from the list, or checks names against it, refuses `required`. docs/guides/fastify.md says it exactly.
  it('the names the README says are exported as routeSettingNames are in it', async () => {
    const { routeSettingNames } = await import('@idem/fastify');
    const sentence = /`config: \{ idempotency: \{ ([^}]*?)(?:, \.\.\.)? \} \}`[\s\S]*?routeSettingNames/.exec(text);
    expect(sentence, 'the per-route sentence moved: revisit this audit').not.toBeNull();
    const named = (sentence?.[1] ?? '').split(', ');
    const besides = /besides ([^)]*?) are exported as `routeSettingNames`/.exec(text)?.[1] ?? '';
    const excluded = [...besides.matchAll(/`(\w+)`/g)].map((m) => m[1]);
    const claimed = named.filter((name) => !excluded.includes(name));
    expect(claimed.filter((name) => !(routeSettingNames as readonly string[]).includes(name))).toEqual([]);
    for (const name of excluded) expect(routeSettingNames as readonly string[]).not.toContain(name);
  });
});

describe('packages/core/README.md', () => {
  const [engineBlock, wrapperBlock] = tsBlocks(readme('core')) as [string, string];

  // The first block uses what its page's prelude declares (the request, its body, the caller, a
  // reply function and the handler): the test defines them, before the block, as a reader's server would.
  type Reply = { status: number; body: unknown };
  const replies: Reply[] = [];
  let runs = 0;
  const fixture = {
    request: { headers: {} as Record<string, string | string[] | undefined> },
    principal: { sub: 'user-1' },
    reply: (status: number, body: unknown) => {
      replies.push({ status, body });
    },
    handler: async () => {
      runs += 1;
      return {
        status: 201,
        headers: { 'content-type': 'application/json' },
        body: new TextEncoder().encode(`{"run":${runs}}`),
      };
    },
  };
  const prelude = `
const fixture = (globalThis as unknown as { coreReadme: any }).coreReadme;
const { request, principal, reply, handler } = fixture;
let contentType = 'application/json';
let body = new Uint8Array();
export function setBody(type: string, bytes: Uint8Array): void { contentType = type; body = bytes; }
`;
  let handle: () => Promise<void>;
  let setBody: (type: string, bytes: Uint8Array) => void;
  beforeAll(async () => {
    (globalThis as unknown as { coreReadme: typeof fixture }).coreReadme = fixture;
    ({ handle, setBody } = await runSnippet<{ handle: () => Promise<void>; setBody: typeof setBody }>(
      `${prelude}${engineBlock}\nexport { handle };\n`,
    ));
  });

  async function call(key: string | undefined, json: string, sub = 'user-1'): Promise<Reply> {
    fixture.request.headers['idempotency-key'] = key;
    fixture.principal.sub = sub;
    setBody('application/json', new TextEncoder().encode(json));
    await handle();
    return replies.at(-1) as Reply;
  }

  it('the engine block runs the handler once per key and caller; the repeat replays its bytes; another request under the key is 422; no key is 400', async () => {
    const first = await call('"k-1"', '{"amount":5}');
    const repeat = await call('"k-1"', '{"amount":5}');
    expect(first.status).toBe(201);
    expect(repeat.status).toBe(201);
    expect(Buffer.from(repeat.body as Uint8Array).toString()).toBe(Buffer.from(first.body as Uint8Array).toString());
    expect(runs).toBe(1);
    expect(await call('"k-1"', '{"amount":6}')).toMatchObject({ status: 422, body: { code: 'fingerprint_mismatch' } });
    expect(await call(undefined, '{}')).toMatchObject({ status: 400, body: { code: 'key_missing' } });
    expect(await call('"k-1"', '{"amount":5}', 'user-2')).toMatchObject({ status: 201 });
    expect(runs).toBe(2);
  });

  it('makeIdempotent: a later call under the key gets the stored result; another payload under it is refused', async () => {
    const { processOrder } = await runSnippet<{
      processOrder: (order: { id: string; amount: number }) => Promise<unknown>;
    }>(`${wrapperBlock}\nexport { processOrder };\n`);
    expect(await processOrder({ id: 'o-1', amount: 5 })).toEqual({ charged: 5 });
    expect(await processOrder({ id: 'o-1', amount: 5 })).toEqual({ charged: 5 });
    await expect(processOrder({ id: 'o-1', amount: 7 })).rejects.toMatchObject({ code: 'fingerprint_mismatch' });
  });
});

describe('packages/client/README.md', () => {
  // The server the snippet talks to: an idempotent POST /v1/charges (Express, the memory store), which
  // records the Authorization and Idempotency-Key of every attempt it receives.
  const seen: Array<{ authorization?: string | undefined; key?: string | undefined }> = [];
  let base = '';
  beforeAll(async () => {
    const { memoryStore } = await import('@idem/core');
    const { idempotency } = await import('@idem/express');
    const express = (await import('express')).default;
    const app = express();
    app.use((req, _res, next) => {
      seen.push({
        authorization: req.headers.authorization,
        key: req.headers['idempotency-key'] as string | undefined,
      });
      next();
    });
    app.use(idempotency({ store: memoryStore(), scope: () => 'demo' }));
    app.use(express.json());
    app.post('/v1/charges', (req, res) => {
      res.status(201).json({ id: crypto.randomUUID(), amount: req.body.amount });
    });
    base = await listening(app.listen(0, '127.0.0.1'));
  });

  it('the snippet posts with the token and a key; when the first answer is lost, the retry sends the same key and `replayed` is true', async () => {
    let code = tsBlocks(readme('client'))[0] as string;
    code = edit(code, "baseUrl: 'https://api.example.com/v1'", `baseUrl: '${base}/v1'`);
    // What the prelude declares: the session that holds the caller's access token.
    code = `const session = { accessToken: () => 'token-1' };\n${code}\nexport { charge };\n`;
    // The network loses the first answer after the server has sent it (the charge ran and was stored).
    const realFetch = globalThis.fetch;
    let calls = 0;
    vi.stubGlobal('fetch', async (input: RequestInfo | URL, init?: RequestInit) => {
      const response = await realFetch(input, init);
      calls += 1;
      if (calls === 1) {
        await response.arrayBuffer();
        throw new TypeError('fetch failed', {
          cause: Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }),
        });
      }
      return response;
    });
    try {
      const { charge } = await runSnippet<{ charge: { status: number; replayed: boolean; body: { id: string } } }>(
        code,
      );
      expect(charge.status).toBe(201);
      expect(charge.replayed).toBe(true);
      expect(seen).toHaveLength(2);
      expect(seen[0]?.authorization).toBe('Bearer token-1');
      expect(seen[1]?.key).toBe(seen[0]?.key);
      expect(seen[0]?.key).toMatch(/^".+"$/);
    } finally {
      vi.unstubAllGlobals();
    }
  });
});

describe('packages/guard/README.md', () => {
  const block = tsBlocks(readme('guard'))[0] as string;

  async function runLogged(code: string): Promise<unknown[][]> {
    const log = vi.spyOn(console, 'log').mockImplementation(() => undefined);
    try {
      await runSnippet(code);
      return log.mock.calls;
    } finally {
      log.mockRestore();
    }
  }

  it('pasted as it is, the placeholder token is refused as a value: 401, a Bearer challenge, a problem body (the JWKS is never fetched)', async () => {
    const logged = await runLogged(block);
    expect(logged).toHaveLength(1);
    const [status, challenge, problem] = logged[0] as [number, string, Record<string, unknown>];
    expect(status).toBe(401);
    expect(challenge).toMatch(/^Bearer realm="api", error="invalid_token"/);
    expect(problem).toMatchObject({ status: 401, code: 'token_malformed' });
  });

  it('with a real access token from the issuer, authenticate() gives the principal; authorize() allows orders:write and refuses a token with only orders:read', async () => {
    let code = edit(block, "jwksUri: 'https://id.example/.well-known/jwks.json'", `jwksUri: '${jwksUri}'`);
    code = edit(code, "'Bearer eyJ...'", `'Bearer ${await token('user-1', 'orders:write')}'`);
    expect(await runLogged(code)).toEqual([[true]]);
    const reader = edit(block, "jwksUri: 'https://id.example/.well-known/jwks.json'", `jwksUri: '${jwksUri}'`).replace(
      "'Bearer eyJ...'",
      `'Bearer ${await token('user-1', 'orders:read')}'`,
    );
    expect(await runLogged(reader)).toEqual([[false]]);
  });
});

const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl()}`,
  await postgresAnswers(databaseUrl()),
  'the @idem/postgres README checks',
);
const withRedis = serviceAvailable(
  `Redis at ${redisUrl()}`,
  await redisAnswers(redisUrl()),
  'the @idem/redis README checks',
);

const response = (text: string) => ({
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(text),
});

describe.skipIf(!withPostgres)('packages/postgres/README.md', () => {
  type Pool = import('pg').Pool;
  type Engine = import('@idem/core').IdempotencyEngine;
  let pool: Pool;
  let engine: Engine;
  beforeAll(async () => {
    // The snippet reads DATABASE_URL, as the tests do (the test's default when it is unset).
    process.env.DATABASE_URL ??= databaseUrl();
    ({ pool, engine } = await runSnippet<{ pool: Pool; engine: Engine }>(
      `${tsBlocks(readme('postgres'))[0] as string}\nexport { pool, engine };\n`,
    ));
    cleanups.push(() => pool.end());
    await pool.query('CREATE TABLE IF NOT EXISTS readme_audit_payments (id text PRIMARY KEY)');
  });

  it('the snippet migrates and gives an engine: a claim runs once and its repeat replays', async () => {
    const request = { key: crypto.randomUUID(), scope: 'demo', operation: 'POST /charges', fingerprint: 'fp' };
    const first = await engine.begin(request);
    expect(first.kind).toBe('execute');
    if (first.kind !== 'execute') return;
    expect(await engine.complete(first.lease, response('{"id":1}'))).toMatchObject({ stored: true });
    const again = await engine.begin(request);
    expect(again.kind).toBe('replay');
    if (again.kind === 'replay') expect(Buffer.from(again.response.body).toString()).toBe('{"id":1}');
  });

  it("in transactional mode, the handler's SQL and the stored response commit together, or neither does", async () => {
    expect(engine.transactional).toBe(true);
    const request = { key: crypto.randomUUID(), scope: 'demo', operation: 'POST /payments', fingerprint: 'fp' };
    const committed = await engine.begin(request);
    if (committed.kind !== 'execute') throw new Error(committed.kind);
    const id = crypto.randomUUID();
    const done = await engine.transaction(
      committed.lease,
      async (tx: { query(sql: string, values?: unknown[]): Promise<unknown> }) => {
        await tx.query('INSERT INTO readme_audit_payments (id) VALUES ($1)', [id]);
        return { value: id, response: response(`{"id":"${id}"}`) };
      },
    );
    expect(done).toMatchObject({ committed: true, stored: true });
    expect((await pool.query('SELECT 1 FROM readme_audit_payments WHERE id = $1', [id])).rowCount).toBe(1);
    expect((await engine.begin(request)).kind).toBe('replay');

    const failed = await engine.begin({ ...request, key: crypto.randomUUID() });
    if (failed.kind !== 'execute') throw new Error(failed.kind);
    const lost = crypto.randomUUID();
    await expect(
      engine.transaction(failed.lease, async (tx: { query(sql: string, values?: unknown[]): Promise<unknown> }) => {
        await tx.query('INSERT INTO readme_audit_payments (id) VALUES ($1)', [lost]);
        throw new Error('the handler failed after its write');
      }),
    ).rejects.toThrow('the handler failed after its write');
    expect((await pool.query('SELECT 1 FROM readme_audit_payments WHERE id = $1', [lost])).rowCount).toBe(0);
    await engine.release(failed.lease);
  });
});

describe.skipIf(!withRedis)('packages/redis/README.md', () => {
  type Engine = import('@idem/core').IdempotencyEngine;
  const text = readme('redis');
  /** The snippet, run once per process it stands for: its engine, and the commands its client sends. */
  async function start(): Promise<{ engine: Engine; commands: string[] }> {
    let code = tsBlocks(text)[0] as string;
    code = edit(code, "prefix: 'billing:idem:'", "prefix: 'audit-readmes:billing:idem:'");
    // The snippet's own ioredis client, kept (to be closed) and its commands recorded by name.
    code = edit(
      code,
      "import { Redis } from 'ioredis';",
      `import { Redis as IoRedis } from 'ioredis';
export const clients: IoRedis[] = [];
export const commands: string[] = [];
class Redis extends IoRedis {
  constructor(url: string) { super(url); clients.push(this); }
  sendCommand(command: any, stream?: any) { commands.push(String(command.name).toUpperCase()); return super.sendCommand(command, stream); }
}`,
    );
    const loaded = await runSnippet<{
      engine: Engine;
      clients: Array<{
        quit(): Promise<unknown>;
        keys(pattern: string): Promise<string[]>;
        del(...keys: string[]): Promise<unknown>;
      }>;
      commands: string[];
    }>(`${code}\nexport { engine };\n`);
    cleanups.push(async () => {
      // The records this audit left (kept for the retention otherwise): only its own prefix.
      const [client] = loaded.clients;
      const keys = (await client?.keys('audit-readmes:billing:idem:*')) ?? [];
      if (keys.length > 0) await client?.del(...keys);
      await Promise.all(loaded.clients.map((each) => each.quit()));
    });
    await loaded.engine.begin({ key: 'warm-up', scope: crypto.randomUUID(), operation: 'x', fingerprint: 'fp' });
    return loaded;
  }
  let engine: Engine;
  let commands: string[];
  let other: { engine: Engine; commands: string[] };
  beforeAll(async () => {
    ({ engine, commands } = await start());
    other = await start();
  });

  async function sent<T>(step: () => Promise<T>): Promise<{ result: T; names: string[] }> {
    commands.length = 0;
    const result = await step();
    return { result, names: [...commands] };
  }

  // Was a defect: the README said "A claim is `SET NX PX`, plus a `GET` when the key is taken", but a
  // claim on a key in progress (the 409 of a retry that comes while the first request runs) is a
  // third round trip: the script that reads the record again with its PTTL (EVALSHA), to tell a live
  // lease from an abandoned one. docs/stores.md's Sizing paragraph had the same slip (fixed, pinned
  // by newcomer.audit.int.test.ts); someone sizing Redis for a retry storm counts one in three short.
  it('the claim sentence names every command a claim sends: on a free key, a completed one, one in progress', async () => {
    const claimSentence = /A claim is ([\s\S]*?)\. Renew/.exec(text)?.[1];
    expect(claimSentence, 'the claim sentence moved: revisit this audit').toBeDefined();
    const request = { key: 'k-1', scope: crypto.randomUUID(), operation: 'POST /charges', fingerprint: 'fp' };
    const free = await sent(() => engine.begin(request));
    expect(free.result.kind).toBe('execute');
    // The retry reaches another process while the first request runs (in one process, a repeat is
    // answered without a store call).
    other.commands.length = 0;
    const inProgress = { result: await other.engine.begin(request), names: [...other.commands] };
    expect(inProgress.result).toMatchObject({ kind: 'reject', error: { code: 'in_progress' } });
    if (free.result.kind === 'execute') await engine.complete(free.result.lease, response('{}'));
    const completed = await sent(() => engine.begin(request));
    expect(completed.result.kind).toBe('replay');
    expect(free.names).toEqual(['SET']);
    expect(completed.names).toEqual(['SET', 'GET']);
    const named = (name: string) => new RegExp(`\\b${name}\\b`).test(claimSentence as string);
    const unnamed = [...new Set([...free.names, ...inProgress.names, ...completed.names])].filter((n) => !named(n));
    expect(unnamed, `claim sentence: "${claimSentence}"; in progress sent ${inProgress.names}`).toEqual([]);
  });

  it('through the engine alone, a response over 4 MiB is refused by the store (response_too_large) and its key is released', async () => {
    const request = { key: 'k-big', scope: crypto.randomUUID(), operation: 'POST /exports', fingerprint: 'fp' };
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error(first.kind);
    const big = { status: 200, headers: {}, body: new Uint8Array(4 * 1024 * 1024 + 1) };
    const done = await engine.complete(first.lease, big);
    expect(done).toMatchObject({ ok: false, reason: 'store-error', error: { code: 'response_too_large' } });
    const retry = await engine.begin(request);
    expect(retry.kind).toBe('execute');
    if (retry.kind === 'execute') await engine.release(retry.lease);
  });
});

describe('packages/webhooks/README.md', () => {
  const block = tsBlocks(readme('webhooks'))[0] as string;
  let base = '';
  let secret = '';
  const applied: unknown[][] = [];
  beforeAll(async () => {
    const { generateSecret } = await import('@idem/webhooks');
    secret = (generateSecret('v1') as { secret: string }).secret;
    // The snippet mounts the receiver and stops; a reader's app then listens.
    const code = edit(block, "secret: process.env.WEBHOOK_SECRET ?? ''", `secret: '${secret}'`);
    const log = vi.spyOn(console, 'log').mockImplementation((...args: unknown[]) => {
      applied.push(args);
    });
    cleanups.push(async () => log.mockRestore());
    base = await listening(
      (await runSnippet<{ server: Server }>(`${code}\nexport const server = app.listen(0, '127.0.0.1');\n`)).server,
    );
  });

  async function deliver(id: string, body: string, headers: Record<string, string> = {}): Promise<Answer> {
    const { sign } = await import('@idem/webhooks');
    const signed = sign({ secret, id, body, timestamp: new Date() });
    return send(`${base}/webhooks/payments`, {
      headers: { ...signed, 'content-type': 'application/json', ...headers },
      body,
    });
  }

  it('a signed event delivered twice is applied once; both deliveries are acknowledged', async () => {
    const body = '{"type":"payment.succeeded","data":{"id":"pay_1"}}';
    const first = await deliver('msg_1', body);
    const second = await deliver('msg_1', body);
    expect(first.status).toBeGreaterThanOrEqual(200);
    expect(first.status).toBeLessThan(300);
    expect(second.status).toBe(first.status);
    expect(applied).toEqual([['applied once', 'msg_1', 'payment.succeeded']]);
  });

  it('a bad signature is 400 signature_mismatch; the id again with another body is 422 event_id_reused', async () => {
    const forged = await deliver('msg_2', '{"type":"a"}', { 'webhook-signature': 'v1,AAAA' });
    expect(forged.status).toBe(400);
    expect(JSON.parse(forged.text)).toMatchObject({ code: 'signature_mismatch' });
    expect((await deliver('msg_3', '{"type":"a"}')).status).toBeLessThan(300);
    const reused = await deliver('msg_3', '{"type":"b"}');
    expect(reused.status).toBe(422);
    expect(JSON.parse(reused.text)).toMatchObject({ code: 'event_id_reused' });
  });

  it('pasted without WEBHOOK_SECRET, the snippet fails at construction with secret_invalid', async () => {
    const saved = process.env.WEBHOOK_SECRET;
    delete process.env.WEBHOOK_SECRET;
    try {
      await expect(runSnippet(block)).rejects.toMatchObject({ code: 'secret_invalid' });
    } finally {
      if (saved !== undefined) process.env.WEBHOOK_SECRET = saved;
    }
  });
});

describe('packages/testkit/README.md', () => {
  it('the snippet registers the Store contract for the memory store (the suite itself runs below, as "memory store")', () => {
    expect(tsBlocks(readme('testkit'))[0]).toContain("describeStore('memory store'");
  });
});
// The snippet, run as a test file runs it: describeStore() registers its suite here, at the top level.
await runSnippet(tsBlocks(readme('testkit'))[0] as string);

describe('every package README, as a newcomer reads it', () => {
  // Was a defect: @idem/redis and @idem/client had no install line at all (the Redis README's snippet
  // imports ioredis, which nothing installs, and never says node-redis is the other choice), and
  // @idem/webhooks' snippet imports express, which its install lines leave out; docs/README.md says
  // "Each package has a short README with its install line". packaging.audit.int.test.ts checks the
  // @idem packages of the lines there are; this checks that there is one, and its third-party modules.
  it('has an npm install line naming the package and every module its snippets import that the package does not bring', () => {
    const missing: string[] = [];
    for (const folder of packageFolders) {
      const text = readme(folder);
      const manifest = JSON.parse(readFileSync(join(root, 'packages', folder, 'package.json'), 'utf8')) as {
        name: string;
        dependencies?: Record<string, string>;
      };
      const installed = new Set<string>();
      for (const [, words] of text.matchAll(/^npm (?:install|i)\b([^\n#]*)/gm)) {
        for (const word of (words ?? '').trim().split(/\s+/)) installed.add(word);
      }
      if (!installed.has(manifest.name)) missing.push(`${folder}: no install line for ${manifest.name}`);
      const brought = new Set([manifest.name, ...Object.keys(manifest.dependencies ?? {})]);
      for (const code of tsBlocks(text)) {
        for (const [, specifier] of code.matchAll(/from '([^'.][^']*)'/g)) {
          const name = (specifier as string).startsWith('@')
            ? (specifier as string).split('/').slice(0, 2).join('/')
            : ((specifier as string).split('/')[0] as string);
          if (name.startsWith('node:') || brought.has(name) || installed.has(name)) continue;
          missing.push(`${folder}: ${name} is imported, not installed`);
        }
      }
    }
    expect([...new Set(missing)]).toEqual([]);
  });
});

describe('README.md (the root) and docs/README.md: the Migrating line', () => {
  // Was a defect: docs/migrating.md now covers moving to the guard from express-jwt with jwks-rsa,
  // express-oauth2-jwt-bearer and @fastify/jwt, but the root README and the documentation map still
  // offered it "from express-idempotency or Powertools" only: a reader with express-jwt in front
  // of their API is not told the page is for them.
  it('names every library docs/migrating.md has a "From ..." section for', () => {
    const page = readFileSync(join(root, 'docs', 'migrating.md'), 'utf8');
    const sources = [...page.matchAll(/^## From (.+)$/gm)].flatMap(([, title]) =>
      (title as string)
        .replace(/\(`[^`]*`\)/g, '')
        .split(/ and /)
        .map((name) => name.trim()),
    );
    expect(sources).toContain('express-jwt');
    for (const [file, line] of [
      ['README.md', /\[Migrating\]\(docs\/migrating\.md\)[^\n]*(?:\n[^\n-][^\n]*)*/],
      ['docs/README.md', /^\| \[Migrating\]\(migrating\.md\) \|[^\n]*/m],
    ] as const) {
      const text = line.exec(readFileSync(join(root, file), 'utf8'))?.[0] ?? '';
      expect(text, `${file} has no Migrating line`).not.toBe('');
      expect(
        sources.filter((name) => !text.includes(name)),
        `${file}: ${text}`,
      ).toEqual([]);
    }
  });
});

describe('the Errors tables of @idem/core, @idem/express, @idem/fastify and @idem/koa', () => {
  // Was a defect: the adapter READMEs open their table with "Every error is application/problem+json
  // (RFC 9457) with a stable `code`:", and the core README's lists the codes, but neither had
  // `response_not_replayable` (500, replayed to every retry of a request whose response was too large
  // to store: the same READMEs' `maxResponseBytes` row names it), `lease_lost` (503 + Retry-After)
  // or `transaction_aborted` (500, the postgres README says the adapters answer it). A client author
  // reading the README for what to handle missed the three; docs/errors.md has them.
  it('lists every code the engine and the adapters answer, with its status', async () => {
    const { errorTable } = await import('@idem/core');
    const problems: string[] = [];
    for (const folder of ['core', 'express', 'fastify', 'koa']) {
      const text = readme(folder);
      // The first table after the heading.
      const after = text.slice(text.indexOf('## Errors')).split('\n');
      const start = after.findIndex((line) => line.startsWith('|'));
      const end = after.findIndex((line, i) => i > start && !line.startsWith('|'));
      const rows = after.slice(start, end).filter((line) => line.startsWith('| `'));
      expect(rows.length, `${folder}: the Errors table moved`).toBeGreaterThan(5);
      for (const [code, { status }] of Object.entries(errorTable)) {
        const row = rows.find((line) => line.includes(`\`${code}\``));
        if (row === undefined) problems.push(`${folder}: no row for ${code}`);
        else if (!row.includes(String(status))) problems.push(`${folder}: ${code} row lacks ${status}`);
      }
    }
    expect(problems).toEqual([]);
  });
});

describe('README.md (the root): the Documentation list', () => {
  // Was a defect: the root README's Documentation list linked every page of the documentation map
  // but the queue consumers guide (docs/guides/queues.md, `makeIdempotent` of @idem/core): a reader
  // with a RabbitMQ, NATS or SQS consumer, not an HTTP route, was not told idem covers it.
  it('links every page the documentation map (docs/README.md) links', () => {
    const linked = (file: string, prefix: string) =>
      new Set(
        [...readFileSync(join(root, file), 'utf8').matchAll(/\]\(([^)#\s]+\.md)(?:#[^)]*)?\)/g)]
          .map(([, target]) => target as string)
          .filter((target) => !target.startsWith('../'))
          .map((target) => `${prefix}${target}`),
      );
    const fromRoot = linked('README.md', '');
    const missing = [...linked('docs/README.md', 'docs/')].filter((page) => !fromRoot.has(page));
    expect(missing).toEqual([]);
  });
});

describe('every package README: names its snippets use without defining', () => {
  // Was a defect: the core README's engine block uses `request`, `contentType`, `body`, `principal`,
  // `reply()` and `handler()`, and the client README's block `session`, none defined in the block
  // nor named in the text (only in the hidden prelude that lets code-blocks.test.ts compile them):
  // pasted alone, the block throws ReferenceError, and nothing tells the reader what to put there.
  it('each name the hidden prelude declares is named in the prose the reader sees', () => {
    const unexplained: string[] = [];
    for (const folder of packageFolders) {
      const text = readme(folder);
      const prelude = /<!--\s*prelude\s*\n([\s\S]*?)-->/.exec(text)?.[1] ?? '';
      const declared = [...prelude.matchAll(/^declare (?:const|function|let) ([A-Za-z_$][\w$]*)/gm)].map((m) => m[1]);
      const prose = text.replace(/<!--[\s\S]*?-->/g, '').replace(/^```[\s\S]*?^```/gm, '');
      for (const name of declared) {
        if (!new RegExp(`\`${name}(?:\\(\\))?\``).test(prose)) unexplained.push(`${folder}: ${name}`);
      }
    }
    expect(unexplained).toEqual([]);
  });
});

describe('docs/README.md: what it says every package README has', () => {
  // Was a defect: the documentation map said "Each package has a short README with its install line,
  // a quick start, its options and its errors"; the client README had none of the four but the quick
  // start, the Redis README neither install line, options table nor errors section.
  it('every package README has the parts the map promises', () => {
    const sentence = /Each package has a short README with ([^:]*):/.exec(
      readFileSync(join(root, 'docs', 'README.md'), 'utf8'),
    )?.[1];
    expect(sentence, 'the sentence moved: revisit this audit').toBeDefined();
    const promised = {
      'install line': /its install line/.test(sentence as string),
      options: /its options/.test(sentence as string) && !/most also/.test(sentence as string),
      errors: /its errors/.test(sentence as string) && !/most also/.test(sentence as string),
    };
    const lacking: string[] = [];
    for (const folder of packageFolders) {
      const text = readme(folder);
      if (promised['install line'] && !/^npm (?:install|i) /m.test(text)) lacking.push(`${folder}: install line`);
      if (promised.options && !/^## Options/m.test(text)) lacking.push(`${folder}: options`);
      if (promised.errors && !/^## Errors/m.test(text)) lacking.push(`${folder}: errors`);
    }
    expect(lacking).toEqual([]);
  });
});
