import { execFileSync } from 'node:child_process';
import { createHash, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { RequestListener } from 'node:http';
import http2, { type Http2ServerRequest, type Http2ServerResponse } from 'node:http2';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A certificate and its key, as PEM, with the RFC 8705 thumbprint of its DER. */
export interface IssuedCert {
  key: Buffer;
  cert: Buffer;
  /** base64url(SHA-256(DER)): what a token bound to this certificate carries in `cnf["x5t#S256"]`. */
  x5t: string;
}

/** A CA, a server certificate for localhost and two client certificates, made with the openssl CLI. */
export interface TestPki {
  ca: Buffer;
  server: IssuedCert;
  clientA: IssuedCert;
  clientB: IssuedCert;
  /** A client certificate signed by no one (RFC 8705 §2.2 allows self-signed ones). */
  selfSigned: IssuedCert;
  remove(): void;
}

const openssl = (args: string[]) => execFileSync('/usr/bin/openssl', args, { stdio: 'ignore' });

// Computed from the PEM by node:crypto's parser rather than by the code under test, so a test
// compares the guard's thumbprint with an independent one.
const thumbprint = (pem: Buffer) => createHash('sha256').update(new X509Certificate(pem).raw).digest('base64url');

/** Builds the test PKI in a temporary folder (P-256 keys, one day of validity). */
export function makeTestPki(): TestPki {
  const dir = mkdtempSync(join(tmpdir(), 'idem-mtls-'));
  const path = (name: string) => join(dir, name);
  const newKey = (name: string) =>
    openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', path(`${name}.key`)]);
  newKey('ca');
  openssl([
    'req',
    '-x509',
    '-new',
    '-key',
    path('ca.key'),
    '-days',
    '1',
    '-subj',
    '/CN=idem test CA',
    '-out',
    path('ca.pem'),
  ]);
  const issue = (name: string, subject: string, extensions: string): IssuedCert => {
    newKey(name);
    openssl(['req', '-new', '-key', path(`${name}.key`), '-subj', subject, '-out', path(`${name}.csr`)]);
    writeFileSync(path(`${name}.ext`), extensions);
    openssl([
      'x509',
      '-req',
      '-in',
      path(`${name}.csr`),
      '-CA',
      path('ca.pem'),
      '-CAkey',
      path('ca.key'),
      '-CAcreateserial',
      '-days',
      '1',
      '-extfile',
      path(`${name}.ext`),
      '-out',
      path(`${name}.pem`),
    ]);
    const cert = readFileSync(path(`${name}.pem`));
    return { key: readFileSync(path(`${name}.key`)), cert, x5t: thumbprint(cert) };
  };
  const server = issue('server', '/CN=localhost', 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  const clientA = issue('client-a', '/CN=client-a', 'extendedKeyUsage=clientAuth\n');
  const clientB = issue('client-b', '/CN=client-b', 'extendedKeyUsage=clientAuth\n');
  newKey('self');
  openssl([
    'req',
    '-x509',
    '-new',
    '-key',
    path('self.key'),
    '-days',
    '1',
    '-subj',
    '/CN=self',
    '-out',
    path('self.pem'),
  ]);
  const selfCert = readFileSync(path('self.pem'));
  const selfSigned = { key: readFileSync(path('self.key')), cert: selfCert, x5t: thumbprint(selfCert) };
  return {
    ca: readFileSync(path('ca.pem')),
    server,
    clientA,
    clientB,
    selfSigned,
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** What a request over TLS got back. */
export interface TlsAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** Sends a request to `https://localhost:<port><path>`, with `client` as the TLS client certificate when given. */
export function tlsRequest(
  port: number,
  pki: TestPki,
  options: { path?: string; method?: string; headers?: Record<string, string>; client?: IssuedCert },
): Promise<TlsAnswer> {
  return new Promise((resolve, reject) => {
    const request = https.request(
      {
        host: '127.0.0.1',
        servername: 'localhost',
        port,
        path: options.path ?? '/orders',
        method: options.method ?? 'GET',
        headers: options.headers ?? {},
        ca: pki.ca,
        // A fresh connection per request: a pooled one would carry the certificate of an earlier request.
        agent: false,
        ...(options.client === undefined ? {} : { key: options.client.key, cert: options.client.cert }),
      },
      (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => {
          body += chunk;
        });
        response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body }));
      },
    );
    request.on('error', reject);
    request.end();
  });
}

/**
 * Sends a request over HTTP/2 with TLS to `https://localhost:<port><path>`, with `client` as the TLS
 * client certificate when given. One session per request, closed after it, for the reason
 * {@link tlsRequest} takes a fresh connection.
 */
export function h2Request(
  port: number,
  pki: TestPki,
  options: { path?: string; method?: string; headers?: Record<string, string>; client?: IssuedCert },
): Promise<TlsAnswer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`https://localhost:${port}`, {
      ca: pki.ca,
      ...(options.client === undefined ? {} : { key: options.client.key, cert: options.client.cert }),
    });
    session.on('error', reject);
    const stream = session.request({
      ':method': options.method ?? 'GET',
      ':path': options.path ?? '/orders',
      ...options.headers,
    });
    let headers: TlsAnswer['headers'] = {};
    let body = '';
    stream.setEncoding('utf8');
    stream.on('response', (received) => {
      headers = received;
    });
    stream.on('data', (chunk: string) => {
      body += chunk;
    });
    stream.on('end', () => {
      session.close();
      resolve({ status: Number(headers[':status']), headers, body });
    });
    stream.on('error', reject);
    stream.end();
  });
}

/**
 * TLS options of a server asking for a client certificate and taking any, or none: the chain is
 * the TLS layer's business, not the guard's, and the guard is what must refuse a missing one.
 */
export const tlsServerOptions = (pki: TestPki) => ({
  key: pki.server.key,
  cert: pki.server.cert,
  ca: pki.ca,
  requestCert: true,
  rejectUnauthorized: false,
});

/** A server listening on an ephemeral port of 127.0.0.1, and how to close it. */
export interface TlsServer {
  port: number;
  close(): Promise<void>;
}

/**
 * Serves `listener` over HTTPS, or over HTTP/2 with TLS only (no fallback to HTTP/1.1, so a test
 * meant for HTTP/2 cannot pass over HTTP/1.1), with {@link tlsServerOptions}.
 */
export function serveTls(pki: TestPki, listener: RequestListener): Promise<TlsServer>;
export function serveTls(
  pki: TestPki,
  listener: (req: Http2ServerRequest, res: Http2ServerResponse) => void,
  options: { http2: true },
): Promise<TlsServer>;
export async function serveTls(
  pki: TestPki,
  listener: RequestListener | ((req: Http2ServerRequest, res: Http2ServerResponse) => void),
  options: { http2?: boolean } = {},
): Promise<TlsServer> {
  // The overloads pair each kind of server with its kind of listener.
  const server = options.http2
    ? http2.createSecureServer(
        { ...tlsServerOptions(pki), allowHTTP1: false },
        listener as (req: Http2ServerRequest, res: Http2ServerResponse) => void,
      )
    : https.createServer(tlsServerOptions(pki), listener as RequestListener);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return {
    port: portOf(server),
    close: () => new Promise<void>((done) => server.close(() => done())),
  };
}

/** The ephemeral port a listening server got. */
export const portOf = (server: { address(): AddressInfo | string | null }) => (server.address() as AddressInfo).port;
