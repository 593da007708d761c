// A server that requires a client certificate refuses a client without one (or with one its CA did
// not sign) in the TLS handshake. What the client sees depends on the TLS version, since the refusal
// arrives at different times, and on the server:
// - TLS 1.2: the server's alert ends the handshake before the client sends anything, and it reaches
//   the error's cause chain (`ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE` for no certificate from an
//   OpenSSL server, `ERR_SSL_TLSV1_ALERT_UNKNOWN_CA` for one its CA did not sign). Every retry meets
//   the same refusal: the call must end at once with its own code, not spend its attempts, and not
//   say `network_error` ("it may have run"), since nothing ran.
// - A Node server (https, `rejectUnauthorized`) checks a certificate it got after the handshake and
//   drops the connection without an alert: the client sees ECONNRESET "before secure TLS connection
//   was established". That cannot be told from a handshake cut by a busy network, but nothing was
//   sent, so a repeat is harmless whatever the method.
// - TLS 1.3: the client's handshake is done before the server has read the certificate, the request
//   goes out, and the alert comes after; undici then reports only "other side closed"
//   (UND_ERR_SOCKET), the alert lost, which is how a connection dropped after the request was sent
//   looks. The client cannot tell, and keeps the rule of an unknown outcome.
// The servers are real: Node's https and `openssl s_server`, which alerts on a certificate it refuses.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createClient, type FetchFunction, type RequestFailedError } from '@idem/client';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type IssuedCert,
  makeTestPki,
  portOf,
  type TestPki,
  tlsServerOptions,
} from '../../guard/test/support/tls-certs.js';
import { failure } from './support/failure.js';

type TlsVersion = 'TLSv1.2' | 'TLSv1.3';

let pki: TestPki;
let dir: string;
const closers: Array<() => Promise<void>> = [];
const agents: Agent[] = [];

beforeAll(() => {
  pki = makeTestPki();
  dir = mkdtempSync(join(tmpdir(), 'idem-client-tls-'));
  for (const [name, pem] of Object.entries({
    'ca.pem': pki.ca,
    'server.pem': pki.server.cert,
    'server.key': pki.server.key,
  })) {
    writeFileSync(join(dir, name), pem);
  }
});

afterAll(async () => {
  await Promise.all(agents.map((agent) => agent.close()));
  await Promise.all(closers.map((close) => close()));
  pki?.remove();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A Node HTTPS server that refuses, in the handshake, a client without a certificate its CA signed. */
async function nodeServer(maxVersion: TlsVersion): Promise<{ url: string; handled: () => number }> {
  let handled = 0;
  const server = https.createServer({ ...tlsServerOptions(pki), rejectUnauthorized: true, maxVersion }, (_req, res) => {
    handled++;
    res.end('{}');
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  closers.push(() => new Promise<void>((done) => server.close(() => done())));
  return { url: `https://localhost:${portOf(server)}`, handled: () => handled };
}

/** `openssl s_server` asking for a client certificate and refusing, with an alert, one it cannot verify. */
async function opensslServer(version: TlsVersion): Promise<string> {
  const child: ChildProcess = spawn(
    '/usr/bin/openssl',
    [
      's_server',
      '-accept',
      '127.0.0.1:0',
      '-cert',
      join(dir, 'server.pem'),
      '-key',
      join(dir, 'server.key'),
      '-CAfile',
      join(dir, 'ca.pem'),
      '-Verify',
      '1',
      '-verify_return_error',
      '-www',
      version === 'TLSv1.2' ? '-tls1_2' : '-tls1_3',
    ],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  closers.push(async () => {
    child.kill();
  });
  const port = await new Promise<number>((resolve, reject) => {
    let out = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const accept = /ACCEPT 127\.0\.0\.1:(\d+)/.exec(out);
      if (accept) resolve(Number(accept[1]));
    });
    child.on('exit', () => reject(new Error(`openssl s_server exited: ${out}`)));
  });
  return `https://localhost:${port}`;
}

/** A client whose fetch presents `certificate` (when given) and trusts `ca`; three attempts, no real waits. */
function clientOf(
  url: string,
  options: { certificate?: IssuedCert; ca?: Buffer | undefined; servername?: string; maxVersion?: TlsVersion } = {},
) {
  const dispatcher = new Agent({
    connect: {
      ...(options.servername === undefined ? {} : { servername: options.servername }),
      ...(options.maxVersion === undefined ? {} : { maxVersion: options.maxVersion }),
      ...(options.ca === undefined ? {} : { ca: options.ca }),
      ...(options.certificate === undefined ? {} : { key: options.certificate.key, cert: options.certificate.cert }),
    },
  });
  agents.push(dispatcher);
  // undici types its fetch with its own RequestInit and Response; at run time they are the standard ones.
  const fetch = ((input: string, init: RequestInit) =>
    undiciFetch(input, { ...(init as object), dispatcher })) as unknown as FetchFunction;
  return createClient({ baseUrl: url, fetch, sleep: async () => {}, retry: { maxAttempts: 3 } });
}

const codesOf = (error: RequestFailedError) => {
  const codes: unknown[] = [];
  for (let cause: unknown = error.cause; typeof cause === 'object' && cause !== null; ) {
    codes.push((cause as { code?: unknown }).code);
    cause = (cause as { cause?: unknown }).cause;
  }
  return codes;
};

describe('a client certificate the server refuses in a TLS 1.2 handshake', () => {
  it('none presented to a Node server: tls_refused after one attempt, for a keyed POST, an unkeyed one and a GET', async () => {
    const { url, handled } = await nodeServer('TLSv1.2');
    const client = clientOf(url, { ca: pki.ca });
    for (const request of [
      () => client.post('/charges', { amount: 1 }),
      () => client.post('/charges', { amount: 1 }, { idempotencyKey: false }),
      () => client.get('/charges'),
    ]) {
      const error = await failure(request());
      expect(codesOf(error)).toContain('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE');
      expect(error.code).toBe('tls_refused');
      expect(error.attempts).toHaveLength(1);
      expect(error.status).toBeUndefined();
    }
    expect(handled()).toBe(0);
  });

  it('none presented to openssl: tls_refused after one attempt', async () => {
    const client = clientOf(await opensslServer('TLSv1.2'), { ca: pki.ca });
    const error = await failure(client.post('/charges', { amount: 1 }));
    expect(codesOf(error)).toContain('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE');
    expect(error.code).toBe('tls_refused');
    expect(error.attempts).toHaveLength(1);
  });

  it('one its CA did not sign, to openssl (alert unknown_ca): tls_refused after one attempt, also unkeyed', async () => {
    const client = clientOf(await opensslServer('TLSv1.2'), { ca: pki.ca, certificate: pki.selfSigned });
    for (const idempotencyKey of [undefined, false as const]) {
      const error = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey }));
      expect(codesOf(error)).toContain('ERR_SSL_TLSV1_ALERT_UNKNOWN_CA');
      expect(error.code).toBe('tls_refused');
      expect(error.attempts).toHaveLength(1);
    }
  });

  it('one its CA did not sign, to a Node server (dropped, no alert): nothing was sent, so even an unkeyed POST is retried', async () => {
    const { url, handled } = await nodeServer('TLSv1.2');
    const client = clientOf(url, { ca: pki.ca, certificate: pki.selfSigned });
    const error = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect(codesOf(error)).toContain('ECONNRESET');
    expect(error.code).toBe('attempts_exhausted');
    expect(error.attempts.map((attempt) => attempt.outcome)).toEqual([
      'network-error',
      'network-error',
      'network-error',
    ]);
    expect(handled()).toBe(0);
  });

  it('the right certificate passes', async () => {
    const { url, handled } = await nodeServer('TLSv1.2');
    const result = await clientOf(url, { ca: pki.ca, certificate: pki.clientA }).post('/charges', { amount: 1 });
    expect(result.status).toBe(200);
    expect(handled()).toBe(1);
  });
});

describe('a client certificate the server refuses in a TLS 1.3 handshake', () => {
  // The alert comes after the client sent the request, and undici reports the socket closing, not
  // the alert: the attempt looks like any connection dropped after the request went out.
  it.each([
    ['none presented, Node server', 'node', undefined],
    ['one its CA did not sign, Node server', 'node', 'selfSigned'],
    ['none presented, openssl', 'openssl', undefined],
    ['one its CA did not sign, openssl', 'openssl', 'selfSigned'],
  ] as const)('%s: an unknown outcome, retried where a repeat is harmless', async (_name, kind, certificate) => {
    const url = kind === 'node' ? (await nodeServer('TLSv1.3')).url : await opensslServer('TLSv1.3');
    const client = clientOf(url, {
      ca: pki.ca,
      ...(certificate === undefined ? {} : { certificate: pki[certificate] }),
    });
    const keyed = await failure(client.post('/charges', { amount: 1 }));
    const unkeyed = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey: false }));
    // Should undici start to keep the alert, this fails: the call must then end with tls_refused.
    expect(codesOf(keyed)).toEqual([undefined, 'UND_ERR_SOCKET']);
    expect(keyed.code).toBe('attempts_exhausted');
    expect(keyed.attempts).toHaveLength(3);
    expect(unkeyed.code).toBe('network_error');
    expect(unkeyed.attempts).toHaveLength(1);
  });

  it('the right certificate passes', async () => {
    const { url } = await nodeServer('TLSv1.3');
    const result = await clientOf(url, { ca: pki.ca, certificate: pki.clientA }).get('/charges');
    expect(result.status).toBe(200);
  });
});

describe('a server certificate the client refuses, over real TLS', () => {
  it.each([
    ['TLSv1.2', 'a CA the client does not trust', undefined, 'SELF_SIGNED_CERT_IN_CHAIN'],
    ['TLSv1.3', 'a CA the client does not trust', undefined, 'SELF_SIGNED_CERT_IN_CHAIN'],
  ] as const)('%s, %s: tls_failed after one attempt, also unkeyed', async (version, _name, ca, code) => {
    const { url, handled } = await nodeServer(version);
    const client = clientOf(url, { ca, certificate: pki.clientA });
    for (const idempotencyKey of [undefined, false as const]) {
      const error = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey }));
      expect(codesOf(error)).toEqual([undefined, code]);
      expect(error.code).toBe('tls_failed');
      expect(error.attempts).toHaveLength(1);
    }
    expect(handled()).toBe(0);
  });

  it('a certificate for another host (ERR_TLS_CERT_ALTNAME_INVALID): tls_failed after one attempt', async () => {
    // The server's certificate names localhost and 127.0.0.1; the client checks it for another name.
    const { url, handled } = await nodeServer('TLSv1.3');
    const client = clientOf(url, { ca: pki.ca, certificate: pki.clientA, servername: 'api.example' });
    const error = await failure(client.get('/charges'));
    expect(codesOf(error)).toEqual([undefined, 'ERR_TLS_CERT_ALTNAME_INVALID']);
    expect(error.code).toBe('tls_failed');
    expect(error.attempts).toHaveLength(1);
    expect(handled()).toBe(0);
  });
});

describe('a handshake that fails over the protocol', () => {
  // The handshake fails on the server's first plain-HTTP bytes (ERR_SSL_WRONG_VERSION_NUMBER), but
  // OpenSSL says the same of a plain-text record after a handshake (a middlebox's answer once the
  // request went out: protocol-mismatch-after-send.int.test.ts): no proof that nothing was sent, so a
  // network error as any connection lost: the keyed POST spends its attempts, the unkeyed one is
  // network_error.
  it('https to a port that speaks plain HTTP: a network error, never tls_failed', async () => {
    let handled = 0;
    const server = http.createServer((_req, res) => {
      handled++;
      res.end('{}');
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    closers.push(() => new Promise<void>((done) => server.close(() => done())));
    const client = clientOf(`https://localhost:${portOf(server)}`);
    const keyed = await failure(client.post('/charges', { amount: 1 }));
    expect(codesOf(keyed)).toEqual([undefined, 'ERR_SSL_WRONG_VERSION_NUMBER']);
    expect(keyed.code).toBe('attempts_exhausted');
    expect(keyed.attempts).toHaveLength(3);
    const unkeyed = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect(unkeyed.code).toBe('network_error');
    expect(unkeyed.attempts).toHaveLength(1);
    expect(handled).toBe(0);
  });

  it('a server that speaks only TLS 1.3 to a client that stops at 1.2: tls_failed after one attempt', async () => {
    const server = https.createServer({ ...tlsServerOptions(pki), minVersion: 'TLSv1.3' }, (_req, res) =>
      res.end('{}'),
    );
    let handled = 0;
    server.on('request', () => handled++);
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    closers.push(() => new Promise<void>((done) => server.close(() => done())));
    const client = clientOf(`https://localhost:${portOf(server)}`, { ca: pki.ca, maxVersion: 'TLSv1.2' });
    const error = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect(codesOf(error)).toEqual([undefined, 'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION']);
    expect(error.code).toBe('tls_failed');
    expect(error.attempts).toHaveLength(1);
    expect(handled).toBe(0);
  });
});
