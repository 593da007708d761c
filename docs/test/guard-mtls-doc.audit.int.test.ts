// Audit: the two TypeScript blocks of "mTLS-bound tokens (RFC 8705)" in docs/guard.md, run as they
// are on the page. code-blocks.test.ts only type-checks them; a regular expression that misses
// Envoy's `Cert=` field, a header read that lets nginx's empty value through as a certificate, or
// a server whose TLS options do not ask for a certificate all type-check.
//
// Each block is compiled and imported. Their issuer's `jwksUri` is answered by a stub of the global
// fetch (the guard takes `globalThis.fetch` when it is created), so the guards are the page's own
// objects, not copies. The Express block's `readFileSync('server.key')` and friends read this
// test's PKI instead of files in the working directory, and it listens on a free port rather than
// 8443; both substitutions are checked to have happened, so a reworded block fails here, not
// silently.
import { createHash, X509Certificate } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request, type Server } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { certificateThumbprint, type Guard, guardRequestFromNode } from '@idem/guard';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { makeTestPki, portOf, type TestPki, tlsRequest } from '../../packages/guard/test/support/tls-certs.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'guard.md'), 'utf8');
const ISSUER = 'https://id.example';
const JWKS_URI = 'https://id.example/jwks';
const AUDIENCE = 'https://api.example';

/** The ```ts blocks of the mTLS section, in page order. */
function sectionBlocks(): string[] {
  const start = page.indexOf('\n## mTLS-bound tokens (RFC 8705)\n');
  if (start === -1) throw new Error('docs/guard.md has no "## mTLS-bound tokens (RFC 8705)": revisit this audit');
  const end = page.indexOf('\n## ', start + 1);
  const section = page.slice(start, end === -1 ? undefined : end);
  return [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] as string);
}

// Inside the repository but outside node_modules: vitest transforms the compiled blocks as it does
// the tests, so their `@idem/*` imports resolve to the packages' source (vitest.config.ts) and no
// build is needed first (CI runs the tests on a clean clone, never built); their other imports
// resolve from the workspace's node_modules as an app's would.
const scratch = join(root, 'docs', 'test', '.scratch', `guard-mtls-doc-${process.pid}`);
let pki: TestPki;
let signingKey: CryptoKey;
let jwks: { keys: unknown[] };
const closers: Array<() => Promise<void>> = [];

/** Compiles one block and imports it, after the given text substitutions (each must match once). */
async function load<T>(name: string, code: string, edits: Array<[string, string]> = []): Promise<T> {
  let source = code;
  for (const [from, to] of edits) {
    expect(source.split(from).length - 1, `docs/guard.md's ${name} block holds ${JSON.stringify(from)} once`).toBe(1);
    source = source.replace(from, to);
  }
  const js = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, verbatimModuleSyntax: true },
  }).outputText;
  const file = join(scratch, `${name}.mjs`);
  writeFileSync(file, js);
  return (await import(pathToFileURL(file).href)) as T;
}

/** An access token of the page's issuer for the page's audience, bound to `x5t` when given. */
function token(x5t?: string): Promise<string> {
  return new SignJWT({ ...(x5t === undefined ? {} : { cnf: { 'x5t#S256': x5t } }) })
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k1' })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject('user-1')
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(signingKey);
}

beforeAll(async () => {
  mkdirSync(scratch, { recursive: true });
  pki = makeTestPki();
  const pair = await generateKeyPair('ES256');
  signingKey = pair.privateKey as CryptoKey;
  jwks = { keys: [{ ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }] };
  // The page's issuer, answered here: the only URL the blocks' guards may fetch.
  vi.stubGlobal('fetch', async (input: string | URL | Request) => {
    const url = input instanceof Request ? input.url : String(input);
    if (url !== JWKS_URI) throw new TypeError(`the doc's guard fetched ${url}`);
    return new Response(JSON.stringify(jwks), {
      headers: { 'content-type': 'application/json', 'cache-control': 'max-age=300' },
    });
  });
});

afterAll(async () => {
  await Promise.all(closers.map((close) => close()));
  vi.unstubAllGlobals();
  pki?.remove();
  rmSync(scratch, { recursive: true, force: true });
});

describe('docs/guard.md, mTLS behind a TLS-terminating proxy: the nginx and Envoy readers', () => {
  let behindNginx: Guard;
  let behindEnvoy: Guard;

  beforeAll(async () => {
    const block = sectionBlocks().find((code) => code.includes('behindEnvoy'));
    expect(block, 'the mTLS section has a block defining behindNginx and behindEnvoy').toBeDefined();
    ({ behindNginx, behindEnvoy } = await load<{ behindNginx: Guard; behindEnvoy: Guard }>(
      'proxy',
      `${block}\nexport { behindNginx, behindEnvoy };\n`,
    ));
  });

  /** The app behind the proxy: plain HTTP, as the proxy sends it on, read by guardRequestFromNode. */
  async function app(guard: Guard): Promise<(headers: Record<string, string>) => Promise<[number, string]>> {
    const server: Server = createServer((req, res) => {
      void guard.authenticate(guardRequestFromNode(req)).then((result) => {
        res.writeHead(result.ok ? 200 : result.error.status);
        res.end(result.ok ? 'ok' : result.error.code);
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    closers.push(() => new Promise((done) => server.close(() => done())));
    const url = `http://127.0.0.1:${portOf(server)}/orders`;
    return (headers) => get(url, headers);
  }

  it('nginx ($ssl_client_escaped_cert, the URL-encoded PEM; empty without one): bound passes, other or none refused', async () => {
    const send = await app(behindNginx);
    const bound = `Bearer ${await token(pki.clientA.x5t)}`;
    const nginx = (pem: Buffer | undefined) => ({
      authorization: bound,
      'x-ssl-client-cert': pem === undefined ? '' : encodeURIComponent(pem.toString()),
    });
    expect(await send(nginx(pki.clientA.cert))).toEqual([200, 'ok']);
    expect(await send(nginx(pki.clientB.cert))).toEqual([401, 'certificate_mismatch']);
    expect(await send(nginx(undefined))).toEqual([401, 'certificate_missing']);
    expect(await send({ authorization: bound })).toEqual([401, 'certificate_missing']);
    // A plain bearer token passes with or without the header: the certificate is not read for it.
    expect(await send({ authorization: `Bearer ${await token()}` })).toEqual([200, 'ok']);
  });

  it("Envoy (SANITIZE_SET: x-forwarded-client-cert is Envoy's one element, Cert= the URL-encoded PEM)", async () => {
    const send = await app(behindEnvoy);
    const bound = `Bearer ${await token(pki.clientA.x5t)}`;
    // Envoy's field order: By, Hash, Cert, then Subject, URI, DNS (docs of
    // x-forwarded-client-cert); the Hash is hex SHA-256 of the DER, the Cert the escaped PEM.
    const xfcc = (pem: Buffer) =>
      `By=spiffe://api.example;Hash=abc;Cert="${encodeURIComponent(pem.toString())}";Subject="CN=client";URI=`;
    expect(await send({ authorization: bound, 'x-forwarded-client-cert': xfcc(pki.clientA.cert) })).toEqual([
      200,
      'ok',
    ]);
    // Cert first: Envoy leaves By out when its own certificate has no URI SAN.
    expect(
      await send({
        authorization: bound,
        'x-forwarded-client-cert': `Cert="${encodeURIComponent(pki.clientA.cert.toString())}"`,
      }),
    ).toEqual([200, 'ok']);
    expect(await send({ authorization: bound, 'x-forwarded-client-cert': xfcc(pki.clientB.cert) })).toEqual([
      401,
      'certificate_mismatch',
    ]);
    // Without `cert: true` Envoy sends no Cert field: no certificate, never another field read as one.
    expect(await send({ authorization: bound, 'x-forwarded-client-cert': 'By=spiffe://api.example;Hash=abc' })).toEqual(
      [401, 'certificate_missing'],
    );
    expect(await send({ authorization: bound })).toEqual([401, 'certificate_missing']);
  });
});

describe('docs/guard.md, mTLS served by Node: the Express block', () => {
  let port = 0;

  beforeAll(async () => {
    const block = sectionBlocks().find((code) => code.includes("from '@idem/express'"));
    expect(block, 'the mTLS section has an Express block').toBeDefined();
    const files: Record<string, Buffer> = {
      'server.key': pki.server.key,
      'server.pem': pki.server.cert,
      'client-ca.pem': pki.ca,
    };
    (globalThis as { __mtlsDocFiles?: Record<string, Buffer> }).__mtlsDocFiles = files;
    const { server } = await load<{ server: Server }>('express', block as string, [
      ["import { readFileSync } from 'node:fs';", 'const readFileSync = (name) => globalThis.__mtlsDocFiles[name];'],
      ['https\n  .createServer(', 'export const server = https\n  .createServer('],
      ['.listen(8443);', ".listen(0, '127.0.0.1');"],
    ]);
    await new Promise<void>((done) => (server.listening ? done() : server.once('listening', () => done())));
    closers.push(() => new Promise((done) => server.close(() => done())));
    port = portOf(server);
  });

  it('takes the bound certificate, refuses another one of the CA (certificate_mismatch) with a Bearer challenge', async () => {
    const bound = { authorization: `Bearer ${await token(pki.clientA.x5t)}` };
    const pass = await tlsRequest(port, pki, { headers: bound, client: pki.clientA });
    expect(pass.status).toBe(404); // through the guard, to an app with no route
    const other = await tlsRequest(port, pki, { headers: bound, client: pki.clientB });
    expect(other.status).toBe(401);
    expect(JSON.parse(other.body)).toMatchObject({ code: 'certificate_mismatch' });
    expect(other.headers['www-authenticate']).toMatch(/^Bearer .*error="invalid_token"/);
  });

  it('with rejectUnauthorized and the CA, Node refuses a self-signed certificate, and no certificate, in the handshake', async () => {
    const bound = { authorization: `Bearer ${await token(pki.selfSigned.x5t)}` };
    await expect(tlsRequest(port, pki, { headers: bound, client: pki.selfSigned })).rejects.toThrow();
    await expect(tlsRequest(port, pki, { headers: bound })).rejects.toThrow();
  });
});

/** A GET with these headers, as [status, body]: node:http, since the global fetch is the JWKS stub. */
function get(url: string, headers: Record<string, string>): Promise<[number, string]> {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve([res.statusCode ?? 0, body]));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('docs/guard.md: certificateThumbprint(cert)', () => {
  it('gives the x5t#S256 of an X509Certificate and of DER bytes: base64url SHA-256 of the DER, no padding', () => {
    const parsed = new X509Certificate(pki.clientA.cert);
    const expected = createHash('sha256').update(parsed.raw).digest('base64url');
    expect(certificateThumbprint(parsed)).toBe(expected);
    expect(certificateThumbprint(parsed.raw)).toBe(expected);
    expect(certificateThumbprint(new Uint8Array(parsed.raw))).toBe(expected);
    expect(expected).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });
});
