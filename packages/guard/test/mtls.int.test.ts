import { createHash, randomUUID, X509Certificate } from 'node:crypto';
import https from 'node:https';
import { calculateJwkThumbprint } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGuard, type Guard, type GuardOptions, type GuardRequest, guardRequestFromNode } from '../src/index.js';
import { makeTestPki, portOf, type TestPki, tlsRequest, tlsServerOptions } from './support/tls-certs.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './support/tokens.js';

// RFC 8705 §3: certificate-bound access tokens. The token carries `cnf["x5t#S256"]`, the SHA-256 of
// the client certificate's DER; the resource server takes the token only from a client that
// presented that certificate in the TLS handshake. Every case runs over real TLS: an https server
// asking for client certificates, and requests made with (or without) one.

const ORIGIN = 'https://api.example';
let pki: TestPki;
const servers: https.Server[] = [];

beforeAll(() => {
  pki = makeTestPki();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => new Promise((done) => server.close(done))));
  pki.remove();
});

/** An https server asking for client certificates (any: the chain is not the guard's business). */
async function serve(guard: Guard, tls: https.ServerOptions = {}): Promise<number> {
  const server = https.createServer({ ...tlsServerOptions(pki), ...tls }, (req, res) => {
    guard.authenticate(guardRequestFromNode(req)).then((result) => {
      if (result.ok) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ sub: result.principal.sub, cnf: result.principal.claims.cnf }));
        return;
      }
      res.writeHead(result.error.status, { 'www-authenticate': result.error.wwwAuthenticate });
      res.end(result.error.code);
    });
  });
  servers.push(server);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return portOf(server);
}

function guardWith(options: Partial<GuardOptions> = {}) {
  const clock = manualClock();
  return createGuard({
    audience: AUDIENCE,
    now: clock.now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
    mtls: {},
    ...options,
  });
}

const boundTo = (x5t: unknown, extra: Record<string, unknown> = {}) =>
  makeToken({ claims: { cnf: { 'x5t#S256': x5t, ...extra } } });

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

describe('mTLS certificate-bound tokens (RFC 8705), the TLS peer certificate', () => {
  it('takes a token bound to the certificate the client presented, and exposes the binding', async () => {
    const port = await serve(guardWith());
    const answer = await tlsRequest(port, pki, { headers: bearer(boundTo(pki.clientA.x5t)), client: pki.clientA });
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body)).toEqual({ sub: 'user-1', cnf: { 'x5t#S256': pki.clientA.x5t } });
  });

  it('refuses it from a client presenting another certificate: certificate_mismatch, Bearer challenge', async () => {
    const port = await serve(guardWith());
    const answer = await tlsRequest(port, pki, { headers: bearer(boundTo(pki.clientA.x5t)), client: pki.clientB });
    expect(answer.status).toBe(401);
    expect(answer.body).toBe('certificate_mismatch');
    expect(answer.headers['www-authenticate']).toMatch(/^Bearer realm="api", error="invalid_token", /);
  });

  it('refuses it from a client presenting no certificate: certificate_missing', async () => {
    const port = await serve(guardWith());
    const answer = await tlsRequest(port, pki, { headers: bearer(boundTo(pki.clientA.x5t)) });
    expect(answer.status).toBe(401);
    expect(answer.body).toBe('certificate_missing');
    expect(answer.headers['www-authenticate']).toMatch(/^Bearer realm="api", error="invalid_token", /);
  });

  it('checks the binding on a verified-token cache hit too: the token passed once, another certificate is still refused', async () => {
    const port = await serve(guardWith());
    const token = boundTo(pki.clientA.x5t);
    expect((await tlsRequest(port, pki, { headers: bearer(token), client: pki.clientA })).status).toBe(200);
    const other = await tlsRequest(port, pki, { headers: bearer(token), client: pki.clientB });
    expect([other.status, other.body]).toEqual([401, 'certificate_mismatch']);
    const none = await tlsRequest(port, pki, { headers: bearer(token) });
    expect([none.status, none.body]).toEqual([401, 'certificate_missing']);
  });

  it('takes a self-signed client certificate (RFC 8705 §2.2): the binding is the check, not the chain', async () => {
    const port = await serve(guardWith());
    const answer = await tlsRequest(port, pki, {
      headers: bearer(boundTo(pki.selfSigned.x5t)),
      client: pki.selfSigned,
    });
    expect(answer.status).toBe(200);
  });

  it('refuses a malformed x5t#S256 as claim_invalid, whatever certificate comes with it', async () => {
    const port = await serve(guardWith());
    const sha = createHash('sha256').update(pki.clientA.cert).digest();
    for (const value of [
      '',
      'abc',
      `${pki.clientA.x5t}=`, // padded
      `${pki.clientA.x5t}A`, // 44 characters
      pki.clientA.x5t.slice(0, 42), // 42
      sha.toString('base64'), // standard base64 of some digest: '+', '/' or '=' in it
      sha.toString('hex'), // 64 hex characters
      `${pki.clientA.x5t.slice(0, 42)}!`,
      42,
      null,
      [pki.clientA.x5t],
    ]) {
      const answer = await tlsRequest(port, pki, { headers: bearer(boundTo(value)), client: pki.clientA });
      expect([answer.status, answer.body], JSON.stringify(value)).toEqual([401, 'claim_invalid']);
    }
  });

  it('still takes plain bearer tokens, with or without a client certificate', async () => {
    const port = await serve(guardWith());
    for (const client of [undefined, pki.clientA]) {
      const answer = await tlsRequest(port, pki, {
        headers: bearer(makeToken()),
        ...(client === undefined ? {} : { client }),
      });
      expect(answer.status).toBe(200);
    }
  });

  it('still refuses a cnf with no binding it checks (a DPoP jkt with no proof, an unknown method) as token_bound', async () => {
    const port = await serve(guardWith());
    for (const cnf of [{ jkt: pki.clientA.x5t }, { jwk: { kty: 'EC' } }, {}, 'x']) {
      const answer = await tlsRequest(port, pki, {
        headers: bearer(makeToken({ claims: { cnf } })),
        client: pki.clientA,
      });
      expect([answer.status, answer.body], JSON.stringify(cnf)).toEqual([401, 'token_bound']);
    }
  });

  it('without the mtls option: a certificate-bound token is refused as token_bound, as before, certificate or not', async () => {
    const port = await serve(guardWith({ mtls: undefined }));
    for (const client of [undefined, pki.clientA]) {
      const answer = await tlsRequest(port, pki, {
        headers: bearer(boundTo(pki.clientA.x5t)),
        ...(client === undefined ? {} : { client }),
      });
      expect([answer.status, answer.body]).toEqual([401, 'token_bound']);
    }
  });

  it('verify(token) has no connection: a certificate-bound token is certificate_missing', async () => {
    const result = await guardWith().verify(boundTo(pki.clientA.x5t));
    expect(result.ok ? 'ok' : result.error.code).toBe('certificate_missing');
  });
});

describe('mTLS behind a TLS-terminating proxy: mtls.certificate reads a header the proxy sets', () => {
  // The proxy ends TLS and passes the client certificate on; the app itself speaks plain TLS to it
  // (here: an https server that asks for no certificate at all).
  const fromHeader = (
    read: (request: GuardRequest) => ReturnType<NonNullable<NonNullable<GuardOptions['mtls']>['certificate']>>,
  ) => guardWith({ mtls: { certificate: read } });
  const header = (request: GuardRequest, name: string) => {
    const value = request.headers[name];
    return typeof value === 'string' ? value : undefined;
  };

  it("nginx's $ssl_client_escaped_cert (URL-encoded PEM): the matching certificate passes, another or none is refused", async () => {
    const guard = fromHeader((request) => {
      const value = header(request, 'x-ssl-client-cert');
      return value === undefined ? undefined : decodeURIComponent(value);
    });
    const port = await serve(guard, { requestCert: false });
    const token = boundTo(pki.clientA.x5t);
    const send = (cert?: Buffer) =>
      tlsRequest(port, pki, {
        headers: {
          ...bearer(token),
          ...(cert === undefined ? {} : { 'x-ssl-client-cert': encodeURIComponent(cert.toString()) }),
        },
      });
    expect((await send(pki.clientA.cert)).status).toBe(200);
    expect((await send(pki.clientB.cert)).body).toBe('certificate_mismatch');
    expect((await send()).body).toBe('certificate_missing');
  });

  it("Envoy's x-forwarded-client-cert (Cert= holds the URL-encoded PEM), as docs/guard.md reads it", async () => {
    // The docs' example, word for word: with forward_client_cert_details SANITIZE_SET, the header is
    // Envoy's own single element.
    const guard = fromHeader((request) => {
      const xfcc = request.headers['x-forwarded-client-cert'];
      const cert = typeof xfcc === 'string' ? /(?:^|;)Cert="([^"]*)"/.exec(xfcc)?.[1] : undefined;
      return cert === undefined ? undefined : decodeURIComponent(cert);
    });
    const port = await serve(guard, { requestCert: false });
    const xfcc = (cert: Buffer) =>
      `By=spiffe://api.example;Hash=${createHash('sha256').update(new X509Certificate(cert).raw).digest('hex')};Cert="${encodeURIComponent(cert.toString())}";Subject="CN=client"`;
    const token = boundTo(pki.clientA.x5t);
    const send = (cert: Buffer) =>
      tlsRequest(port, pki, { headers: { ...bearer(token), 'x-forwarded-client-cert': xfcc(cert) } });
    expect((await send(pki.clientA.cert)).status).toBe(200);
    expect((await send(pki.clientB.cert)).body).toBe('certificate_mismatch');
  });

  it('takes DER bytes and an X509Certificate from the function as it takes PEM', async () => {
    for (const form of [
      (pem: Buffer) => new X509Certificate(pem).raw,
      (pem: Buffer) => new Uint8Array(new X509Certificate(pem).raw),
      (pem: Buffer) => new X509Certificate(pem),
      (pem: Buffer) => pem.toString(),
    ]) {
      const guard = fromHeader((request) => {
        const which = header(request, 'x-which');
        return which === undefined ? undefined : form(which === 'a' ? pki.clientA.cert : pki.clientB.cert);
      });
      const token = boundTo(pki.clientA.x5t);
      const pass = await guard.authenticate({ headers: { ...bearer(token), 'x-which': 'a' } });
      expect(pass.ok).toBe(true);
      const other = await guard.authenticate({ headers: { ...bearer(token), 'x-which': 'b' } });
      expect(other.ok ? 'ok' : other.error.code).toBe('certificate_mismatch');
    }
  });

  it('a header value that is no certificate, or a function that throws, is no certificate: certificate_missing', async () => {
    const token = boundTo(pki.clientA.x5t);
    for (const read of [
      () => 'not a certificate',
      () => Buffer.from('garbage'),
      () => '',
      () => {
        throw new URIError('URI malformed');
      },
    ]) {
      const result = await fromHeader(read).authenticate({ headers: bearer(token) });
      expect(result.ok ? 'ok' : result.error.code).toBe('certificate_missing');
    }
  });

  it('reads the certificate only for a token bound to one', async () => {
    let reads = 0;
    const guard = fromHeader(() => {
      reads += 1;
      return undefined;
    });
    expect((await guard.authenticate({ headers: bearer(makeToken()) })).ok).toBe(true);
    expect(reads).toBe(0);
  });
});

describe('DPoP and mTLS together: a token bound both ways needs both', () => {
  const keys = testKeys();
  const proof = (accessToken: string, key = keys.ec) =>
    signSegments(
      b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: key.publicJwk }),
      b64url({
        jti: randomUUID(),
        htm: 'GET',
        htu: `${ORIGIN}/orders`,
        iat: Math.floor(manualClock().now() / 1000),
        ath: createHash('sha256').update(accessToken).digest('base64url'),
      }),
      'ES256',
      key.privateKey,
    );

  it('passes with the proof and the certificate; refuses without either, or with the wrong one', async () => {
    const port = await serve(guardWith({ dpop: { origin: ORIGIN } }));
    const jkt = await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256');
    const token = boundTo(pki.clientA.x5t, { jkt });
    const dpop = (key = keys.ec) => ({ authorization: `DPoP ${token}`, dpop: proof(token, key) });
    const cases: Array<[string, Record<string, string>, TestPki['clientA'] | undefined, string]> = [
      ['proof and certificate', dpop(), pki.clientA, 'ok'],
      ['proof, other certificate', dpop(), pki.clientB, 'certificate_mismatch'],
      ['proof, no certificate', dpop(), undefined, 'certificate_missing'],
      ['certificate, no proof (bearer)', bearer(token), pki.clientA, 'token_bound'],
      ['certificate, proof of another key', dpop(keys.ec2), pki.clientA, 'token_binding_invalid'],
    ];
    for (const [name, headers, client, expected] of cases) {
      const answer = await tlsRequest(port, pki, { headers, ...(client === undefined ? {} : { client }) });
      expect(answer.status === 200 ? 'ok' : answer.body, name).toBe(expected);
    }
  });

  it('a DPoP token bound to no certificate passes with mtls on, certificate or not', async () => {
    const port = await serve(guardWith({ dpop: { origin: ORIGIN } }));
    const jkt = await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256');
    const token = makeToken({ claims: { cnf: { jkt } } });
    for (const client of [undefined, pki.clientB]) {
      const answer = await tlsRequest(port, pki, {
        headers: { authorization: `DPoP ${token}`, dpop: proof(token) },
        ...(client === undefined ? {} : { client }),
      });
      expect(answer.status).toBe(200);
    }
  });
});

describe('the mtls option', () => {
  it('is an object whose certificate, when given, is a function; unknown names are refused', () => {
    expect(() => guardWith({ mtls: true as never })).toThrow(/mtls must be an object/);
    expect(() => guardWith({ mtls: null as never })).toThrow(/mtls must be an object/);
    expect(() => guardWith({ mtls: { certificate: 'x-client-cert' as never } })).toThrow(
      /mtls.certificate must be a function/,
    );
    expect(() => guardWith({ mtls: { certficate: () => undefined } as never })).toThrow(
      /mtls: unknown option "certficate"; it takes certificate/,
    );
    expect(() => guardWith({ mtl: {} } as never)).toThrow(/createGuard: unknown option "mtl"/);
  });
});
