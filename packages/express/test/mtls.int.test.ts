// RFC 8705 certificate-bound tokens through the Express glue, over real TLS: the glue hands the
// request's socket to the guard (guardRequestFromNode), which reads the client certificate from it.
import express from 'express';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { boundHeaders, mtlsGuard } from '../../guard/test/support/mtls-glue.js';
import { makeTestPki, serveTls, type TestPki, type TlsServer, tlsRequest } from '../../guard/test/support/tls-certs.js';
import { guard } from '../src/auth.js';

let pki: TestPki;
let server: TlsServer;
let handled = 0;

beforeAll(async () => {
  pki = makeTestPki();
  const edge = mtlsGuard();
  const app = express();
  app.get('/orders', guard(edge), (req, res) => {
    handled += 1;
    res.json({ sub: req.auth?.sub, cnf: req.auth?.claims.cnf });
  });
  server = await serveTls(pki, app);
});
afterAll(async () => {
  await server.close();
  pki.remove();
});

it('Express over TLS: the bound certificate passes; another or none is 401 with its code and a Bearer challenge', async () => {
  const headers = boundHeaders(pki.clientA);
  const pass = await tlsRequest(server.port, pki, { headers, client: pki.clientA });
  expect(pass.status).toBe(200);
  expect(JSON.parse(pass.body)).toEqual({ sub: 'user-1', cnf: { 'x5t#S256': pki.clientA.x5t } });
  expect(handled).toBe(1);

  for (const [client, code] of [
    [pki.clientB, 'certificate_mismatch'],
    [undefined, 'certificate_missing'],
  ] as const) {
    const refused = await tlsRequest(server.port, pki, { headers, ...(client === undefined ? {} : { client }) });
    expect(refused.status).toBe(401);
    expect(JSON.parse(refused.body)).toMatchObject({ code, status: 401 });
    expect(refused.headers['www-authenticate']).toMatch(/^Bearer realm="api", error="invalid_token"/);
  }
  expect(handled).toBe(1);
});
