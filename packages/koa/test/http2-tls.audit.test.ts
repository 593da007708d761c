// A Koa app on `http2.createSecureServer({ allowHTTP1: true })`: HTTP/1.1 clients get an
// IncomingMessage/ServerResponse, HTTP/2 clients an Http2ServerRequest/Http2ServerResponse, and both
// share the one idempotency store.
import { mkdtempSync, rmSync } from 'node:fs';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { h1post, h2post, selfSignedCert } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

let dir: string;
let key: Buffer;
let cert: Buffer;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'idem-h2-tls-'));
  ({ key, cert } = selfSignedCert(dir));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Was a defect: `replayHeaders: ['upgrade']` was accepted, so a 426 answered to an HTTP/1.1 client was
// stored with its `Upgrade` field, and its retry over HTTP/2 was answered 500 for as long as the
// record lived (Node refuses a connection-specific field on an HTTP/2 response, RFC 9113 8.2.2).
// Such fields are now refused in `replayHeaders`, and never written on an HTTP/2 response.
it('replayHeaders naming a field about one connection is refused at construction', () => {
  for (const name of ['upgrade', 'Upgrade', 'te', 'proxy-connection', 'http2-settings']) {
    expect(() => idempotency({ store: memoryStore(), scope: () => 'user_1', replayHeaders: [name] }), name).toThrow(
      TypeError,
    );
  }
});

it('TLS allowHTTP1: a 426 stored over HTTP/1.1 is replayed over HTTP/2', async () => {
  let runs = 0;
  const app = new Koa();
  app.silent = true;
  app.use(idempotency({ store: memoryStore(), scope: () => 'user_1' }));
  app.use((ctx) => {
    runs++;
    // RFC 9110 §15.5.22: a 426 "MUST send an Upgrade header field".
    ctx.set('upgrade', 'TLS/1.3');
    ctx.status = 426;
    ctx.body = { error: 'upgrade_required' };
  });
  const server = http2.createSecureServer({ allowHTTP1: true, key, cert }, app.callback() as never);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const session = http2.connect(`https://127.0.0.1:${port}`, { ca: cert, rejectUnauthorized: false });
  session.on('error', () => undefined);
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        session.destroy();
        server.close(() => resolve());
      }),
  );
  const headers = { 'content-type': 'application/json', 'idempotency-key': 'tls-426-1' };
  const first = await h1post(port, headers, '{"amount":1}', cert);
  expect(first.status).toBe(426);
  const retry = await h2post(session, headers, '{"amount":1}');
  expect(retry.status).toBe(426);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(retry.body).toBe(first.body);
  expect(runs).toBe(1);
});
