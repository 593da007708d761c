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
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const readme = (pkg: string): string => readFileSync(join(root, 'packages', pkg, 'README.md'), 'utf8');

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
  it('HELD: a POST /orders with a token and a key runs once; its retry replays it byte for byte, and names the caller and the key', async () => {
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

  it('HELD: keys are scoped by the verified caller: another user with the same key gets their own execution', async () => {
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

  it('HELD: no token is 401 with a Bearer challenge; a token without orders:write is 403 insufficient_scope; no key is 400 key_missing', async () => {
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

  it('HELD: "A 404 no route answered ... is not stored": the same key again is a fresh 404, not a replay', async () => {
    const request = async () =>
      send(`${base}/nowhere`, { headers: { authorization: `Bearer ${await bearer()}`, 'idempotency-key': '"e404"' } });
    const first = await request();
    const second = await request();
    expect([first.status, second.status]).toEqual([404, 404]);
    expect(second.headers.get('idempotent-replayed')).toBeNull();
  });

  it('HELD: "nor, with idempotencyErrors() mounted, a body parser\'s refusal": malformed JSON, then the fixed body under the same key runs', async () => {
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

  it("HELD: a body over express.json()'s limit (100 kB) is not stored either: the smaller retry runs", async () => {
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

  it('HELD: per route, `config: { idempotency: false }` leaves a route alone and an object overrides the plugin; the operation is the route template', async () => {
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

  it('HELD: "a wrong name or value fails at startup"; bad plugin options are a TypeError when the plugin is registered', async () => {
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
