// Fastify with `http2: true, https: { allowHTTP1: true }`: HTTP/1.1 and HTTP/2 clients on one server
// and one store. The server runs in a child process (the sources, through tsx), so that what ends a real
// process (an unhandled rejection, Node's default `--unhandled-rejections=throw`) shows as its exit.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import http2 from 'node:http2';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import type { H2Answer } from '../../core/test/support/h2.js';
import { h1post, h2post, selfSignedCert } from '../../core/test/support/h2.js';

const packageDir = join(dirname(fileURLToPath(import.meta.url)), '..');
let dir: string;
let cert: Buffer;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'idem-h2-tls-'));
  ({ cert } = selfSignedCert(dir));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const closers: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// The app: a route answering 426 with the Upgrade field RFC 9110 §15.5.22 requires of it, behind a
// hook that sets `Keep-Alive` on every reply (as apps tuned for HTTP/1.1 do).
const server = `
import { readFileSync } from 'node:fs';
import Fastify from 'fastify';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
const app = Fastify({ http2: true, https: { allowHTTP1: true, key: readFileSync(process.env.KEY), cert: readFileSync(process.env.CERT) } });
app.addHook('onRequest', (request, reply, done) => {
  reply.header('keep-alive', 'timeout=5');
  done();
});
await app.register(idempotency, { store: memoryStore(), scope: () => 'user_1' });
app.post('/charges', async (request, reply) => {
  reply.code(426).header('upgrade', 'TLS/1.3');
  return { error: 'upgrade_required' };
});
await app.listen({ port: 0, host: '127.0.0.1' });
process.stdout.write(app.server.address().port + '\\n');
`;

// Was a defect: the retry over HTTP/2 of a key answered first over HTTP/1.1 killed the server process
// when a hook had set a connection-specific field on the reply (`Keep-Alive`, fine on HTTP/1.1): the
// early answer copied it onto the HTTP/2 response, Node threw ERR_HTTP2_INVALID_CONNECTION_HEADERS
// inside a promise callback, and nothing caught it. Now such fields are left out over HTTP/2 (RFC
// 9113 8.2.2), and a failure while answering early gives the answer up instead of the process.
it('TLS allowHTTP1: an HTTP/2 retry of a 426 stored over HTTP/1.1 is replayed; the process stays up', async () => {
  // Through tsx from the repository root, whose tsconfig maps @idem/* to the sources: no build needed.
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', server], {
    cwd: join(packageDir, '..', '..'),
    env: { ...process.env, KEY: join(dir, 'k.pem'), CERT: join(dir, 'c.pem') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk;
  });
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) =>
      resolve(`server exited (${code ?? signal}): ${stderr.split('\n').find((line) => /Error/.test(line))}`),
    ),
  );
  closers.push(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill();
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout?.once('data', (chunk: Buffer) => resolve(Number(String(chunk).trim())));
    exited.then((why) => reject(new Error(why)));
  });
  const headers = { 'content-type': 'application/json', 'idempotency-key': 'tls-426-1' };
  const first = await h1post(port, headers, '{"amount":1}', cert);
  expect(first.status).toBe(426);
  const session = http2.connect(`https://127.0.0.1:${port}`, { ca: cert, rejectUnauthorized: false });
  session.on('error', () => undefined);
  closers.push(() => void session.destroy());
  // A stream the dying server drops (an error, or an end without a response) is reported by why.
  const answer = await h2post(session, headers, '{"amount":1}').catch(() => undefined);
  const retry = answer !== undefined && Number.isFinite(answer.status) ? answer : await exited;
  expect(retry).toMatchObject({ status: 426, body: first.body });
  expect((retry as H2Answer).headers['idempotent-replayed']).toBe('true');
  expect(child.exitCode).toBeNull();
});
