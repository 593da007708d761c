// `tls_failed` says "the attempt was not sent". For ERR_SSL_WRONG_VERSION_NUMBER that would hold for
// `https:` to a plain-HTTP port, where the mismatch ends the handshake. But
// OpenSSL gives the same code, over TLS 1.2 (1.3 says ERR_SSL_BAD_RECORD_TYPE), for a record that is
// not TLS on a connection whose handshake is done: a middlebox (a load balancer, a proxy) writing a plain-HTTP answer into the TLS stream after the
// request went out. undici then loses the code behind "other side closed" or its headers timeout,
// but a `fetch` over node:https (node-fetch and its kin keep the `code`) rejects with it, and the
// client ends an unkeyed POST that the server has run with `tls_failed`, "not sent": a caller who
// believes it sends the charge again. The error alone cannot tell the two apart: a network error,
// never tls_failed.
import https from 'node:https';
import net from 'node:net';
import { createClient, type FetchFunction } from '@idem/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeTestPki, portOf, type TestPki, tlsServerOptions } from '../../guard/test/support/tls-certs.js';
import { failure } from './support/failure.js';

let pki: TestPki;
let handled = 0;
let proxyPort = 0;
const closers: Array<() => void> = [];

beforeAll(async () => {
  pki = makeTestPki();
  // The server runs the request; the middlebox in front of it then answers in plain text.
  let inject = () => {};
  const server = https.createServer({ ...tlsServerOptions(pki), requestCert: false, maxVersion: 'TLSv1.2' }, () => {
    handled++;
    inject();
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const proxy = net.createServer((client) => {
    const upstream = net.connect(portOf(server), '127.0.0.1');
    client.on('error', () => {});
    upstream.on('error', () => {});
    client.pipe(upstream);
    upstream.on('data', (chunk) => client.write(chunk));
    inject = () => {
      upstream.destroy();
      client.write('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n');
      setTimeout(() => client.destroy(), 200);
    };
  });
  await new Promise<void>((done) => proxy.listen(0, '127.0.0.1', done));
  proxyPort = (proxy.address() as net.AddressInfo).port;
  closers.push(
    () => server.close(),
    () => proxy.close(),
  );
});

afterAll(() => {
  for (const close of closers) close();
  pki?.remove();
});

function headersOf(init: RequestInit): Record<string, string> {
  const headers: Record<string, string> = {};
  new Headers(init.headers).forEach((value, name) => {
    headers[name] = value;
  });
  return headers;
}

/** A fetch over node:https, as node-fetch is: the socket's error under `cause`, its code kept. */
const httpsFetch: FetchFunction = (input, init) =>
  new Promise((resolve, reject) => {
    const request = https.request(
      input,
      {
        method: init.method,
        headers: headersOf(init),
        ca: pki.ca,
        agent: false,
      },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => resolve(new Response(Buffer.concat(chunks), { status: response.statusCode ?? 500 })));
      },
    );
    request.on('error', (error) => reject(new TypeError('fetch failed', { cause: error })));
    request.end(init.body as string | undefined);
  });

const client = () =>
  createClient({
    baseUrl: `https://localhost:${proxyPort}`,
    fetch: httpsFetch,
    sleep: async () => {},
    retry: { maxAttempts: 3 },
  });

describe('a protocol mismatch after the request was sent', () => {
  it('the premise: the server ran the request, and the error says ERR_SSL_WRONG_VERSION_NUMBER', async () => {
    const before = handled;
    const error = await failure(client().post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect((error.cause as { cause?: { code?: string } } | undefined)?.cause?.code).toBe(
      'ERR_SSL_WRONG_VERSION_NUMBER',
    );
    expect(handled - before).toBe(1);
  });

  // Decided: "wrong version number" is no proof that nothing was sent, so it is a network error
  // (an unknown outcome), never tls_failed.
  it('an unkeyed POST the server ran is network_error, not tls_failed', async () => {
    const error = await failure(client().post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect(error.code).toBe('network_error');
  });
});
