// RFC 8705 certificate-bound tokens through the Fastify glue, over real TLS (HTTPS and HTTP/2 over
// TLS): the hook hands `request.raw`'s socket to the guard, which reads the client certificate.
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { boundHeaders, mtlsGuard } from '../../guard/test/support/mtls-glue.js';
import {
  h2Request,
  type IssuedCert,
  makeTestPki,
  type TestPki,
  tlsRequest,
  tlsServerOptions,
} from '../../guard/test/support/tls-certs.js';
import { guard } from '../src/auth.js';

let pki: TestPki;
const apps: FastifyInstance[] = [];

beforeAll(() => {
  pki = makeTestPki();
});
afterAll(async () => {
  await Promise.all(apps.map((app) => app.close()));
  pki.remove();
});

async function start(http2Enabled: boolean): Promise<number> {
  const edge = mtlsGuard();
  const tls = tlsServerOptions(pki);
  const app = (
    http2Enabled ? Fastify({ http2: true, https: { ...tls, allowHTTP1: false } }) : Fastify({ https: tls })
  ) as FastifyInstance;
  app.get('/orders', { onRequest: guard(edge) }, async (request) => ({ sub: request.auth?.sub }));
  apps.push(app);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const address = app.server.address();
  return typeof address === 'object' && address !== null ? address.port : 0;
}

it('Fastify over HTTPS: the bound certificate passes; another or none is 401 with its code', async () => {
  const port = await start(false);
  const headers = boundHeaders(pki.clientA);
  expect((await tlsRequest(port, pki, { headers, client: pki.clientA })).status).toBe(200);
  const other = await tlsRequest(port, pki, { headers, client: pki.clientB });
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await tlsRequest(port, pki, { headers });
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});

it('Fastify over HTTP/2 with TLS: the certificate is read through the stream to its session socket', async () => {
  const port = await start(true);
  const send = (client?: IssuedCert) =>
    h2Request(port, pki, { headers: boundHeaders(pki.clientA), ...(client === undefined ? {} : { client }) });
  expect((await send(pki.clientA)).status).toBe(200);
  const other = await send(pki.clientB);
  expect([other.status, JSON.parse(other.body).code]).toEqual([401, 'certificate_mismatch']);
  const none = await send();
  expect([none.status, JSON.parse(none.body).code]).toEqual([401, 'certificate_missing']);
});
