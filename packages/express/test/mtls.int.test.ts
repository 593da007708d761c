// RFC 8705 certificate-bound tokens through the Express glue, over real TLS: the glue hands the
// request's socket to the guard (guardRequestFromNode), which reads the client certificate from it.
import https from 'node:https';
import { createGuard } from '@idem/guard';
import express from 'express';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { makeTestPki, portOf, type TestPki, tlsRequest } from '../../guard/test/support/tls-certs.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';

let pki: TestPki;
let server: https.Server;
let port: number;
let handled = 0;

beforeAll(async () => {
  pki = makeTestPki();
  const edge = createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
    mtls: {},
  });
  const app = express();
  app.get('/orders', guard(edge), (req, res) => {
    handled += 1;
    res.json({ sub: req.auth?.sub, cnf: req.auth?.claims.cnf });
  });
  server = https.createServer(
    { key: pki.server.key, cert: pki.server.cert, ca: pki.ca, requestCert: true, rejectUnauthorized: false },
    app,
  );
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  port = portOf(server);
});
afterAll(async () => {
  await new Promise((done) => server.close(done));
  pki.remove();
});

it('Express over TLS: the bound certificate passes; another or none is 401 with its code and a Bearer challenge', async () => {
  const headers = { authorization: `Bearer ${makeToken({ claims: { cnf: { 'x5t#S256': pki.clientA.x5t } } })}` };
  const pass = await tlsRequest(port, pki, { headers, client: pki.clientA });
  expect(pass.status).toBe(200);
  expect(JSON.parse(pass.body)).toEqual({ sub: 'user-1', cnf: { 'x5t#S256': pki.clientA.x5t } });
  expect(handled).toBe(1);

  for (const [client, code] of [
    [pki.clientB, 'certificate_mismatch'],
    [undefined, 'certificate_missing'],
  ] as const) {
    const refused = await tlsRequest(port, pki, { headers, ...(client === undefined ? {} : { client }) });
    expect(refused.status).toBe(401);
    expect(JSON.parse(refused.body)).toMatchObject({ code, status: 401 });
    expect(refused.headers['www-authenticate']).toMatch(/^Bearer realm="api", error="invalid_token"/);
  }
  expect(handled).toBe(1);
});
