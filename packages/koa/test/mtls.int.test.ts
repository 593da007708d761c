// RFC 8705 certificate-bound tokens through the Koa glue, over real TLS (HTTPS and HTTP/2 over TLS):
// the glue hands `ctx.req`'s socket to the guard (guardRequestFromNode), which reads the client
// certificate from it. Over HTTP/2 that socket is Node's proxy of the session's TLS socket.
import http2 from 'node:http2';
import https from 'node:https';
import { createGuard } from '@idem/guard';
import Koa from 'koa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { h2Request, makeTestPki, portOf, type TestPki, tlsRequest } from '../../guard/test/support/tls-certs.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';

let pki: TestPki;
let server: https.Server;
let port: number;
let h2Server: http2.Http2SecureServer;
let h2Port: number;

beforeAll(async () => {
  pki = makeTestPki();
  const edge = createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
    mtls: {},
  });
  const app = new Koa();
  app.use(guard(edge));
  app.use((ctx) => {
    ctx.body = { sub: ctx.state.auth?.sub };
  });
  const tls = { key: pki.server.key, cert: pki.server.cert, ca: pki.ca, requestCert: true, rejectUnauthorized: false };
  server = https.createServer(tls, app.callback());
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  port = portOf(server);
  // HTTP/2 only: a client that cannot speak it fails rather than passing over HTTP/1.1.
  h2Server = http2.createSecureServer({ ...tls, allowHTTP1: false }, app.callback());
  await new Promise<void>((done) => h2Server.listen(0, '127.0.0.1', done));
  h2Port = portOf(h2Server);
});
afterAll(async () => {
  await new Promise((done) => server.close(done));
  await new Promise((done) => h2Server.close(done));
  pki.remove();
});

it('Koa over TLS: the bound certificate passes; another or none is 401 with its code', async () => {
  const headers = { authorization: `Bearer ${makeToken({ claims: { cnf: { 'x5t#S256': pki.clientA.x5t } } })}` };
  expect((await tlsRequest(port, pki, { headers, client: pki.clientA })).status).toBe(200);
  const other = await tlsRequest(port, pki, { headers, client: pki.clientB });
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await tlsRequest(port, pki, { headers });
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});

it('Koa over HTTP/2 with TLS: the bound certificate passes; another or none is 401 with its code', async () => {
  const headers = { authorization: `Bearer ${makeToken({ claims: { cnf: { 'x5t#S256': pki.clientA.x5t } } })}` };
  const pass = await h2Request(h2Port, pki, { headers, client: pki.clientA });
  expect([pass.status, JSON.parse(pass.body)]).toEqual([200, { sub: 'user-1' }]);
  const other = await h2Request(h2Port, pki, { headers, client: pki.clientB });
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await h2Request(h2Port, pki, { headers });
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});
