// RFC 8705 certificate-bound tokens through the Koa glue, over real TLS (HTTPS and HTTP/2 over TLS):
// the glue hands `ctx.req`'s socket to the guard (guardRequestFromNode), which reads the client
// certificate from it. Over HTTP/2 that socket is Node's proxy of the session's TLS socket.
import Koa from 'koa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { boundHeaders, mtlsGuard } from '../../guard/test/support/mtls-glue.js';
import {
  h2Request,
  makeTestPki,
  serveTls,
  type TestPki,
  type TlsServer,
  tlsRequest,
} from '../../guard/test/support/tls-certs.js';
import { guard } from '../src/auth.js';

let pki: TestPki;
let overHttps: TlsServer;
let overH2: TlsServer;

beforeAll(async () => {
  pki = makeTestPki();
  const edge = mtlsGuard();
  const app = new Koa();
  app.use(guard(edge));
  app.use((ctx) => {
    ctx.body = { sub: ctx.state.auth?.sub };
  });
  overHttps = await serveTls(pki, app.callback());
  overH2 = await serveTls(pki, app.callback(), { http2: true });
});
afterAll(async () => {
  await Promise.all([overHttps.close(), overH2.close()]);
  pki.remove();
});

it('Koa over TLS: the bound certificate passes; another or none is 401 with its code', async () => {
  const headers = boundHeaders(pki.clientA);
  expect((await tlsRequest(overHttps.port, pki, { headers, client: pki.clientA })).status).toBe(200);
  const other = await tlsRequest(overHttps.port, pki, { headers, client: pki.clientB });
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await tlsRequest(overHttps.port, pki, { headers });
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});

it('Koa over HTTP/2 with TLS: the bound certificate passes; another or none is 401 with its code', async () => {
  const headers = boundHeaders(pki.clientA);
  const pass = await h2Request(overH2.port, pki, { headers, client: pki.clientA });
  expect([pass.status, JSON.parse(pass.body)]).toEqual([200, { sub: 'user-1' }]);
  const other = await h2Request(overH2.port, pki, { headers, client: pki.clientB });
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await h2Request(overH2.port, pki, { headers });
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});
