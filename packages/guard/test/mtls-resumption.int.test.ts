import { constants } from 'node:crypto';
import http2 from 'node:http2';
import https from 'node:https';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Guard, guardRequestFromNode } from '../src/index.js';
import { mtlsGuard } from './support/mtls-glue.js';
import { type IssuedCert, makeTestPki, portOf, type TestPki, tlsServerOptions } from './support/tls-certs.js';
import { makeToken } from './support/tokens.js';

// RFC 8705 §3 on a resumed TLS session. A resumed handshake carries no Certificate message: the
// server knows the client certificate only from the session it resumes (a ticket it issued, or its
// session cache). `mtls: {}` reads `socket.getPeerCertificate()`, so this checks that Node 24 still
// answers the certificate of the session there, for TLS 1.3 tickets, TLS 1.2 tickets and TLS 1.2
// session ids; and that a session made without a certificate never lends one.

let pki: TestPki;
const servers: Array<https.Server | http2.Http2SecureServer> = [];

beforeAll(() => {
  pki = makeTestPki();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => new Promise((done) => server.close(done))));
  pki.remove();
});

type Version = 'TLSv1.2' | 'TLSv1.3';

// The TLS 1.2 server cache of session ids, for servers with tickets off.
function withSessionCache(server: https.Server) {
  const cache = new Map<string, Buffer>();
  server.on('newSession', (id: Buffer, data: Buffer, done: () => void) => {
    cache.set(id.toString('hex'), data);
    done();
  });
  server.on('resumeSession', (id: Buffer, done: (error: Error | null, data: Buffer | null) => void) => {
    done(null, cache.get(id.toString('hex')) ?? null);
  });
}

// What both HTTP/1.1 and HTTP/2 responses offer, for the one handler.
interface Answer {
  writeHead(status: number, headers: Record<string, number>): unknown;
  end(body: string): unknown;
}

// Answers `ok` or the guard's error code; a guard of its own per server, so no test reads another's
// verified-token cache.
const answerWith = (guard: Guard) => (req: Parameters<typeof guardRequestFromNode>[0], res: Answer) => {
  guard.authenticate(guardRequestFromNode(req)).then((result) => {
    const body = result.ok ? 'ok' : result.error.code;
    // A length, not chunks, so the HTTP/1.1 client below reads the body as it is.
    res.writeHead(result.ok ? 200 : result.error.status, { 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
};

async function serve(resumption: 'ticket' | 'session id' | 'http2'): Promise<number> {
  const answer = answerWith(mtlsGuard());
  const server =
    resumption === 'http2'
      ? http2.createSecureServer({ ...tlsServerOptions(pki), allowHTTP1: false }, answer)
      : https.createServer(
          {
            ...tlsServerOptions(pki),
            ...(resumption === 'session id' ? { secureOptions: constants.SSL_OP_NO_TICKET } : {}),
          },
          answer,
        );
  if (resumption === 'session id') withSessionCache(server as https.Server);
  servers.push(server);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return portOf(server);
}

interface Exchange {
  status: number;
  body: string;
  /** `socket.isSessionReused()` of the client's connection. */
  reused: boolean;
  /** The session to resume with, as the server last gave it. */
  session: Buffer | undefined;
}

// One HTTP/1.1 request on a connection of its own, over tls.connect so the session is in the test's
// hands: `session` resumes one, and the answer says whether the handshake did.
function exchange(
  port: number,
  options: { version: Version; token: string; client?: IssuedCert | undefined; session?: Buffer | undefined },
): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({
      host: '127.0.0.1',
      servername: 'localhost',
      port,
      ca: pki.ca,
      minVersion: options.version,
      maxVersion: options.version,
      ...(options.client === undefined ? {} : { key: options.client.key, cert: options.client.cert }),
      ...(options.session === undefined ? {} : { session: options.session }),
    });
    let session: Buffer | undefined;
    let reused = false;
    let text = '';
    // TLS 1.3 tickets come after the handshake, before the answer: all of them are in by 'end'.
    socket.on('session', (received: Buffer) => {
      session = received;
    });
    socket.once('secureConnect', () => {
      reused = socket.isSessionReused();
      socket.write(
        `GET /orders HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer ${options.token}\r\nconnection: close\r\n\r\n`,
      );
    });
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      text += chunk;
    });
    socket.on('error', reject);
    socket.on('end', () => {
      const [head = '', body = ''] = text.split('\r\n\r\n');
      resolve({ status: Number(head.split(' ')[1]), body, reused, session });
    });
  });
}

const boundTo = (cert: IssuedCert) => makeToken({ claims: { cnf: { 'x5t#S256': cert.x5t } } });

const cases: Array<[Version, 'ticket' | 'session id']> = [
  ['TLSv1.3', 'ticket'],
  ['TLSv1.2', 'ticket'],
  ['TLSv1.2', 'session id'],
];

describe.each(cases)('mTLS on a resumed session: %s, %s', (version, resumption) => {
  it('the certificate of the resumed session binds: its token passes, another certificate’s is refused', async () => {
    const port = await serve(resumption);
    const first = await exchange(port, { version, token: boundTo(pki.clientA), client: pki.clientA });
    expect([first.status, first.body, first.reused]).toEqual([200, 'ok', false]);
    expect(first.session).toBeInstanceOf(Buffer);
    // The same client comes back with its session.
    const again = await exchange(port, {
      version,
      token: boundTo(pki.clientA),
      client: pki.clientA,
      session: first.session,
    });
    expect([again.status, again.body, again.reused]).toEqual([200, 'ok', true]);
    const other = await exchange(port, {
      version,
      token: boundTo(pki.clientB),
      client: pki.clientA,
      session: first.session,
    });
    expect([other.status, other.body, other.reused]).toEqual([401, 'certificate_mismatch', true]);
  });

  it('the resumed session is what counts, not the certificate the client would send: no Certificate message is sent', async () => {
    const port = await serve(resumption);
    const first = await exchange(port, { version, token: boundTo(pki.clientA), client: pki.clientA });
    // Configured with client B, the client resumes A's session: the server sees A, as it should (the
    // session's secrets were agreed by the holder of A's key).
    const resumedAsB = await exchange(port, {
      version,
      token: boundTo(pki.clientB),
      client: pki.clientB,
      session: first.session,
    });
    expect([resumedAsB.status, resumedAsB.body, resumedAsB.reused]).toEqual([401, 'certificate_mismatch', true]);
  });

  it('a session made without a certificate lends none when resumed: certificate_missing, with or without one configured', async () => {
    const port = await serve(resumption);
    const first = await exchange(port, { version, token: makeToken() });
    expect([first.status, first.body]).toEqual([200, 'ok']);
    for (const client of [undefined, pki.clientA]) {
      const resumed = await exchange(port, { version, token: boundTo(pki.clientA), client, session: first.session });
      expect([resumed.status, resumed.body, resumed.reused], client?.x5t ?? 'none').toEqual([
        401,
        'certificate_missing',
        true,
      ]);
    }
  });
});

// The same over HTTP/2: the request's socket is the session's TLS socket (a proxy of it).
function h2Exchange(
  port: number,
  options: { token: string; client?: IssuedCert | undefined; session?: Buffer | undefined },
): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    let session: Buffer | undefined;
    let reused = false;
    const connection = http2.connect(`https://localhost:${port}`, {
      createConnection: () => {
        const socket = tls.connect({
          host: '127.0.0.1',
          servername: 'localhost',
          port,
          ca: pki.ca,
          ALPNProtocols: ['h2'],
          minVersion: 'TLSv1.3',
          ...(options.client === undefined ? {} : { key: options.client.key, cert: options.client.cert }),
          ...(options.session === undefined ? {} : { session: options.session }),
        });
        socket.on('session', (received: Buffer) => {
          session = received;
        });
        socket.once('secureConnect', () => {
          reused = socket.isSessionReused();
        });
        return socket;
      },
    });
    connection.on('error', reject);
    const stream = connection.request({ ':path': '/orders', authorization: `Bearer ${options.token}` });
    let status = 0;
    let body = '';
    stream.setEncoding('utf8');
    stream.on('response', (headers) => {
      status = Number(headers[':status']);
    });
    stream.on('data', (chunk: string) => {
      body += chunk;
    });
    stream.on('error', reject);
    stream.on('end', () => connection.close());
    connection.on('close', () => resolve({ status, body, reused, session }));
    stream.end();
  });
}

describe('mTLS on a resumed session over HTTP/2 (TLS 1.3 ticket)', () => {
  it("binds the resumed session's certificate, and a session made without one lends none", async () => {
    const port = await serve('http2');
    const first = await h2Exchange(port, { token: boundTo(pki.clientA), client: pki.clientA });
    expect([first.status, first.body, first.reused]).toEqual([200, 'ok', false]);
    const again = await h2Exchange(port, { token: boundTo(pki.clientA), client: pki.clientA, session: first.session });
    expect([again.status, again.body, again.reused]).toEqual([200, 'ok', true]);
    const other = await h2Exchange(port, { token: boundTo(pki.clientB), client: pki.clientB, session: first.session });
    expect([other.status, other.body, other.reused]).toEqual([401, 'certificate_mismatch', true]);
    const bare = await h2Exchange(port, { token: makeToken() });
    const resumed = await h2Exchange(port, { token: boundTo(pki.clientA), client: pki.clientA, session: bare.session });
    expect([resumed.status, resumed.body, resumed.reused]).toEqual([401, 'certificate_missing', true]);
  });
});
