import { constants } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import https from 'node:https';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { guardRequestFromNode } from '../src/index.js';
import { mtlsGuard } from './support/mtls-glue.js';
import { type IssuedCert, makeTestPki, portOf, type TestPki, tlsServerOptions } from './support/tls-certs.js';
import { makeToken } from './support/tokens.js';

// RFC 8705 §3 over a TLS 1.2 connection that renegotiates. A renegotiation is a new handshake on the
// same connection: it can bring a client certificate the first one did not. `mtls: {}` reads
// `socket.getPeerCertificate()` at each request, so every request on a keep-alive connection is bound
// to the certificate of the connection's latest handshake, never to one read earlier. (TLS 1.3 and
// HTTP/2 have no renegotiation.)
//
// Two things of Node's (OpenSSL 3) these cases pin: a server-initiated renegotiation is answered by a
// client that resumes its session, so it brings no new certificate unless the server refuses
// resumption on renegotiation (SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION); and a Node client
// cannot change its certificate between handshakes (`setKeyCert` on a client socket changes nothing),
// so a client renegotiating presents the one it had.

let pki: TestPki;
const servers: https.Server[] = [];

beforeAll(() => {
  pki = makeTestPki();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => new Promise((done) => server.close(done))));
  pki.remove();
});

/**
 * A TLS 1.2 server with the guard: `/renegotiate` renegotiates the request's connection, asking for a
 * client certificate, and answers when the new handshake is done; any other path answers `ok` or the
 * guard's error code. `requestCert` is the first handshake's.
 */
async function serve(options: {
  requestCert: boolean;
  secureOptions?: number;
}): Promise<{ port: number; socketErrors: Error[] }> {
  const guard = mtlsGuard();
  const socketErrors: Error[] = [];
  // A length, not chunks, so the client below reads each answer on the kept-alive connection.
  const answer = (res: ServerResponse, status: number, body: string) => {
    res.writeHead(status, { 'content-length': Buffer.byteLength(body) });
    res.end(body);
  };
  const server = https.createServer(
    {
      ...tlsServerOptions(pki),
      requestCert: options.requestCert,
      secureOptions: options.secureOptions ?? 0,
      minVersion: 'TLSv1.2',
      maxVersion: 'TLSv1.2',
    },
    (req, res) => {
      if (req.url === '/renegotiate') {
        (req.socket as tls.TLSSocket).renegotiate({ requestCert: true, rejectUnauthorized: false }, (error) => {
          answer(res, error ? 500 : 200, error ? error.message : 'renegotiated');
        });
        return;
      }
      guard.authenticate(guardRequestFromNode(req)).then((result) => {
        answer(res, result.ok ? 200 : result.error.status, result.ok ? 'ok' : result.error.code);
      });
    },
  );
  // What Node does to a connection it refuses to renegotiate is an error on the server's socket.
  server.on('secureConnection', (socket: tls.TLSSocket) => {
    socket.on('error', (error) => socketErrors.push(error));
  });
  servers.push(server);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return { port: portOf(server), socketErrors };
}

interface Answer {
  status: number;
  body: string;
}

/** One TLS 1.2 connection, kept alive: requests are sent on it one after another. */
interface Connection {
  socket: tls.TLSSocket;
  get(path: string, token?: string): Promise<Answer>;
  /** Renegotiates from the client's side. */
  renegotiate(): Promise<void>;
  /** Resolves when the server ends or drops the connection. */
  closed: Promise<void>;
}

async function connect(port: number, client?: IssuedCert): Promise<Connection> {
  const socket = tls.connect({
    host: '127.0.0.1',
    servername: 'localhost',
    port,
    ca: pki.ca,
    minVersion: 'TLSv1.2',
    maxVersion: 'TLSv1.2',
    ...(client === undefined ? {} : { key: client.key, cert: client.cert }),
  });
  const closed = new Promise<void>((done) => socket.once('close', () => done()));
  // A dropped connection is what one test looks for: its error is not the test's failure.
  socket.on('error', () => undefined);
  await new Promise<void>((done, fail) => {
    socket.once('secureConnect', done);
    socket.once('error', fail);
  });
  let buffer = '';
  let waiting: ((answer: Answer) => void) | undefined;
  let failed: ((error: Error) => void) | undefined;
  socket.setEncoding('utf8');
  socket.on('data', (chunk: string) => {
    buffer += chunk;
    const end = buffer.indexOf('\r\n\r\n');
    if (end < 0 || waiting === undefined) return;
    const head = buffer.slice(0, end);
    const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0);
    if (buffer.length < end + 4 + length) return;
    const body = buffer.slice(end + 4, end + 4 + length);
    buffer = buffer.slice(end + 4 + length);
    const resolve = waiting;
    waiting = undefined;
    resolve({ status: Number(head.split(' ')[1]), body });
  });
  socket.on('close', () => failed?.(new Error('connection closed')));
  return {
    socket,
    closed,
    get: (path, token) =>
      new Promise<Answer>((resolve, reject) => {
        waiting = resolve;
        failed = reject;
        const authorization = token === undefined ? '' : `authorization: Bearer ${token}\r\n`;
        socket.write(`GET ${path} HTTP/1.1\r\nhost: localhost\r\n${authorization}\r\n`);
      }),
    // Node calls back only when the new handshake is done: a connection dropped first rejects.
    renegotiate: () =>
      new Promise<void>((done, fail) => {
        closed.then(() => fail(new Error('connection closed')));
        const started = socket.renegotiate({}, (error) => (error ? fail(error) : done()));
        if (!started) fail(new Error('renegotiation not started'));
      }),
  };
}

const boundTo = (cert: IssuedCert) => makeToken({ claims: { cnf: { 'x5t#S256': cert.x5t } } });

// The Finished message of the connection's latest handshake, as the client saw it: a new one after
// each renegotiation, so a case can tell that one happened.
const finished = (connection: Connection) => connection.socket.getFinished()?.toString('hex');

describe('mTLS on a TLS 1.2 connection that renegotiates', () => {
  it('the server asks for a certificate by renegotiating: before it, certificate_missing; after it, on the same connection, the token passes', async () => {
    const { port } = await serve({
      requestCert: false,
      secureOptions: constants.SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION,
    });
    const connection = await connect(port, pki.clientA);
    // Asked for none, the client sent none, though it has one.
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 401, body: 'certificate_missing' });
    const before = finished(connection);
    expect(await connection.get('/renegotiate')).toEqual({ status: 200, body: 'renegotiated' });
    expect(finished(connection)).not.toBe(before);
    // The same keep-alive connection, its certificate now A's.
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 200, body: 'ok' });
    expect(await connection.get('/orders', boundTo(pki.clientB))).toEqual({
      status: 401,
      body: 'certificate_mismatch',
    });
    connection.socket.end();
    await connection.closed;
  });

  it('a renegotiation that resumes the session (Node’s default) brings no certificate: still certificate_missing, none is made up', async () => {
    const { port } = await serve({ requestCert: false });
    const connection = await connect(port, pki.clientA);
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 401, body: 'certificate_missing' });
    const before = finished(connection);
    expect(await connection.get('/renegotiate')).toEqual({ status: 200, body: 'renegotiated' });
    expect(finished(connection)).not.toBe(before);
    expect(connection.socket.isSessionReused()).toBe(true);
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 401, body: 'certificate_missing' });
    // A token that is bound to nothing passes on it as on any other connection.
    expect(await connection.get('/orders', makeToken())).toEqual({ status: 200, body: 'ok' });
    connection.socket.end();
    await connection.closed;
  });

  it('a client that renegotiates keeps its binding: each request reads the certificate of the latest handshake', async () => {
    const { port } = await serve({ requestCert: true });
    const connection = await connect(port, pki.clientA);
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 200, body: 'ok' });
    const before = finished(connection);
    await connection.renegotiate();
    // A full handshake, not a resumed one: the client sent its certificate again.
    expect([finished(connection) !== before, connection.socket.isSessionReused()]).toEqual([true, false]);
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 200, body: 'ok' });
    expect(await connection.get('/orders', boundTo(pki.clientB))).toEqual({
      status: 401,
      body: 'certificate_mismatch',
    });
    connection.socket.end();
    await connection.closed;
  });

  it(`Node lets a client renegotiate ${tls.CLIENT_RENEG_LIMIT} times in a row (each within ${tls.CLIENT_RENEG_WINDOW} s of the handshake before), then drops the connection`, async () => {
    // The defaults: three, each within ten minutes of the last (a renegotiation costs the server a full
    // handshake). The window runs from the previous handshake: the count starts again only after a
    // pause that long.
    expect([tls.CLIENT_RENEG_LIMIT, tls.CLIENT_RENEG_WINDOW]).toEqual([3, 600]);
    const { port, socketErrors } = await serve({ requestCert: true });
    const connection = await connect(port, pki.clientA);
    for (let i = 0; i < tls.CLIENT_RENEG_LIMIT; i++) await connection.renegotiate();
    expect(await connection.get('/orders', boundTo(pki.clientA))).toEqual({ status: 200, body: 'ok' });
    expect(socketErrors).toEqual([]);
    // The fourth: the server drops the connection before the handshake is done.
    await expect(connection.renegotiate()).rejects.toThrow('connection closed');
    // Emitted on the socket, then again by the HTTP server destroying it with that error.
    expect(new Set(socketErrors.map((error) => (error as NodeJS.ErrnoException).code))).toEqual(
      new Set(['ERR_TLS_SESSION_ATTACK']),
    );
  });
});
