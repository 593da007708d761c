// Audit: the block of "A client certificate (mTLS)" in docs/client.md, run as it is on the page
// against a real HTTPS server: Express with @idem/express's guard (`mtls: {}`, the certificate read
// from the TLS connection) and idempotency in front of a POST /v1/charges. code-blocks.test.ts only
// type-checks the block; a dispatcher that never reaches the connection, a certificate the server
// never asks for, or a client that refreshes a token for a missing certificate all type-check.
//
// The block is compiled and imported (under docs/test/.scratch, so vitest resolves its `@idem/*`
// imports to the packages' source), once per certificate it is given: its `readFileSync('client.pem')`
// and friends read this test's PKI, its baseUrl names the test server, and its `session` (declared by
// the page's prelude) hands out tokens bound as each test needs. Each substitution is checked to have
// happened once, so a reworded block fails here, not silently.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https, { type Server } from 'node:https';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { type ClientResult, isRequestFailedError, type RequestFailedError } from '@idem/client';
import { memoryStore } from '@idem/core';
import { guard, idempotency } from '@idem/express';
import express from 'express';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  makeTestPki,
  portOf,
  serveTls,
  type TestPki,
  type TlsServer,
  tlsServerOptions,
} from '../../packages/guard/test/support/tls-certs.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'client.md'), 'utf8');
const ISSUER = 'https://id.example';
const AUDIENCE = 'https://api.example';

/** The ```ts block of the section. */
function sectionBlock(): string {
  const start = page.indexOf('\n## A client certificate (mTLS)\n');
  if (start === -1) throw new Error('docs/client.md has no "## A client certificate (mTLS)": revisit this audit');
  const end = page.indexOf('\n## ', start + 1);
  const blocks = [...page.slice(start, end === -1 ? undefined : end).matchAll(/```ts\n([\s\S]*?)```/g)];
  expect(blocks, 'the mTLS section of docs/client.md has one TypeScript block').toHaveLength(1);
  return (blocks[0] as RegExpMatchArray)[1] as string;
}

const scratch = join(root, 'docs', 'test', '.scratch', `client-mtls-doc-${process.pid}`);
let pki: TestPki;
let server: TlsServer;
/** The same app behind a server that refuses, in the handshake, a certificate its CA did not sign. */
let strictServer: Server;
let signingKey: CryptoKey;
let requests = 0;

/** What the page's block defines, as this test exports it. */
interface PageClient {
  api: import('@idem/client').Client;
  dispatcher: { close(): Promise<void> };
  createCharge(amount: number): Promise<ClientResult<{ id: string }>>;
}

/** A session as the page's `getToken` uses it: the tokens it gave, and how often it was asked to refresh. */
interface TestSession {
  accessToken(): Promise<string>;
  refresh(): Promise<string>;
  refreshes: number;
}

/** An access token of the issuer for the API, bound to the certificate with this thumbprint. */
function boundToken(x5t: string): Promise<string> {
  return new SignJWT({ cnf: { 'x5t#S256': x5t }, jti: crypto.randomUUID() })
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k1' })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject('merchant-1')
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(signingKey);
}

/** A session whose tokens are bound to `first`'s certificate, and after a refresh to `refreshed`'s. */
function session(first: string, refreshed = first): TestSession {
  const s: TestSession = {
    refreshes: 0,
    accessToken: () => boundToken(s.refreshes === 0 ? first : refreshed),
    refresh: () => {
      s.refreshes++;
      return boundToken(refreshed);
    },
  };
  return s;
}

let loads = 0;
const dispatchers: PageClient['dispatcher'][] = [];

/**
 * Compiles the page's block and imports it, with `files` for its readFileSync and `tokens` for its
 * session. `edits` are further substitutions, each of which must match once.
 */
async function loadPage(
  files: Record<string, Buffer>,
  tokens: TestSession,
  edits: Array<[string, string]> = [],
  port = server.port,
): Promise<PageClient> {
  const name = `page${++loads}`;
  (globalThis as Record<string, unknown>)[`__${name}`] = { files, session: tokens };
  let source = sectionBlock();
  for (const [from, to] of [
    ["import { readFileSync } from 'node:fs';", `const readFileSync = (file) => globalThis.__${name}.files[file];`],
    ["baseUrl: 'https://api.example.com/v1',", `baseUrl: 'https://127.0.0.1:${port}/v1',`],
    ...edits,
  ] as Array<[string, string]>) {
    expect(source.split(from).length - 1, `docs/client.md's mTLS block holds ${JSON.stringify(from)} once`).toBe(1);
    source = source.replace(from, to);
  }
  source = `const session = globalThis.__${name}.session;\n${source}\nexport { api, dispatcher, createCharge };\n`;
  const js = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, verbatimModuleSyntax: true },
  }).outputText;
  const file = join(scratch, `${name}.mjs`);
  writeFileSync(file, js);
  const loaded = (await import(pathToFileURL(file).href)) as PageClient;
  dispatchers.push(loaded.dispatcher);
  return loaded;
}

const filesOf = (client: { key: Buffer; cert: Buffer }) => ({
  'client.key': client.key,
  'client.pem': client.cert,
  'api-ca.pem': pki.ca,
});

/** The error createCharge rejects with, and the client's error it wraps. */
async function refusal(promise: Promise<unknown>): Promise<{ message: string; cause: RequestFailedError }> {
  const error = await promise.then(
    () => {
      throw new Error('expected createCharge to fail');
    },
    (reason: unknown) => reason,
  );
  expect(error).toBeInstanceOf(Error);
  const { message, cause } = error as Error;
  if (!isRequestFailedError(cause)) throw new Error(`createCharge's error has no RequestFailedError cause: ${message}`);
  return { message, cause };
}

beforeAll(async () => {
  mkdirSync(scratch, { recursive: true });
  pki = makeTestPki();
  const pair = await generateKeyPair('ES256');
  signingKey = pair.privateKey as CryptoKey;
  const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' };
  let charges = 0;
  const app = express();
  app.use((_req, _res, next) => {
    requests++;
    next();
  });
  app.use(guard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, jwks: { keys: [jwk] } }], mtls: {} }));
  app.post('/v1/charges', idempotency({ store: memoryStore() }), express.json(), (req, res) => {
    charges++;
    res.status(201).json({ id: `ch_${charges}`, amount: req.body.amount });
  });
  // tlsServerOptions: the server asks for a client certificate and takes any (rejectUnauthorized:
  // false), so the binding, not the handshake, decides, and the guard's 401s reach the client.
  server = await serveTls(pki, app);
  strictServer = https.createServer({ ...tlsServerOptions(pki), rejectUnauthorized: true }, app);
  await new Promise<void>((done) => strictServer.listen(0, '127.0.0.1', done));
});

afterAll(async () => {
  await Promise.all(dispatchers.map((dispatcher) => dispatcher.close()));
  await server?.close();
  await new Promise((done) => strictServer?.close(done));
  pki?.remove();
  rmSync(scratch, { recursive: true, force: true });
});

describe('docs/client.md, "A client certificate (mTLS)": the block against a guard with mtls: {}', () => {
  it('with the certificate the token is bound to: 201, and a keyed retry is replayed', async () => {
    const tokens = session(pki.clientA.x5t);
    const { api, createCharge } = await loadPage(filesOf(pki.clientA), tokens);
    const charge = await createCharge(500);
    expect(charge.status).toBe(201);
    expect(charge.body).toMatchObject({ amount: 500 });
    expect(charge.replayed).toBe(false);
    // The same operation again (its key), over the same certificate: the stored outcome.
    const again = await api.post<{ id: string }>('/charges', { amount: 500 }, { idempotencyKey: charge.key as string });
    expect(again.status).toBe(201);
    expect(again.replayed).toBe(true);
    expect(again.body.id).toBe(charge.body.id);
    expect(tokens.refreshes).toBe(0);
  });

  it('with another certificate: certificate_mismatch after the one refresh, as the page says', async () => {
    const tokens = session(pki.clientA.x5t);
    const { createCharge } = await loadPage(filesOf(pki.clientB), tokens);
    const before = requests;
    const { message, cause } = await refusal(createCharge(500));
    expect(message).toBe('the token is bound to another certificate');
    expect(cause.code).toBe('http_error');
    expect(cause.status).toBe(401);
    expect(cause.body).toMatchObject({ code: 'certificate_mismatch', retryable: false });
    expect(cause.response?.headers.get('www-authenticate')).toMatch(/^Bearer .*error="invalid_token"/);
    expect(tokens.refreshes).toBe(1);
    expect(requests - before).toBe(2);
  });

  it('after a certificate rotation: the cached token (old certificate) is refused, the refreshed one passes', async () => {
    const tokens = session(pki.clientA.x5t, pki.clientB.x5t);
    const { createCharge } = await loadPage(filesOf(pki.clientB), tokens);
    const charge = await createCharge(700);
    expect(charge.status).toBe(201);
    expect(charge.attempts.map((attempt) => attempt.status)).toEqual([401, 201]);
    expect(tokens.refreshes).toBe(1);
  });

  it('a fetch that presents no certificate: certificate_missing at once, no refresh, one request', async () => {
    const tokens = session(pki.clientA.x5t);
    // The same block with the Agent's certificate left out: the misconfiguration the page describes.
    const { createCharge } = await loadPage(filesOf(pki.clientA), tokens, [
      ["    key: readFileSync('client.key'),\n    cert: readFileSync('client.pem'),\n", ''],
    ]);
    const before = requests;
    const { message, cause } = await refusal(createCharge(500));
    expect(message).toBe('no client certificate reached the API');
    expect(cause.code).toBe('http_error');
    expect(cause.status).toBe(401);
    expect(cause.body).toMatchObject({ code: 'certificate_missing', retryable: false });
    expect(cause.attempts).toHaveLength(1);
    expect(tokens.refreshes).toBe(0);
    expect(requests - before).toBe(1);
  });

  it('a certificate the server refuses in the handshake: no HTTP answer, network errors, attempts_exhausted (not tls_failed)', async () => {
    const tokens = session(pki.selfSigned.x5t);
    // No real waits between attempts, and three of them; the page's client otherwise.
    const { createCharge } = await loadPage(
      filesOf(pki.selfSigned),
      tokens,
      [
        [
          '  // Tokens from an authorization server',
          '  sleep: async () => {},\n  retry: { maxAttempts: 3 },\n  // Tokens from an authorization server',
        ],
      ],
      portOf(strictServer),
    );
    const before = requests;
    const error = await createCharge(500).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    if (!isRequestFailedError(error)) throw new Error(`expected a RequestFailedError, got ${String(error)}`);
    expect(error.code).toBe('attempts_exhausted');
    expect(error.status).toBeUndefined();
    expect(error.attempts.map((attempt) => attempt.outcome)).toEqual([
      'network-error',
      'network-error',
      'network-error',
    ]);
    expect(requests - before).toBe(0);
  });
});
