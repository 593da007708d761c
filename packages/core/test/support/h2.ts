import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type http2 from 'node:http2';
import https from 'node:https';
import { join } from 'node:path';

/** What an HTTP/2 client got back: its status, headers and body as text. */
export interface H2Answer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  body: string;
}

/** Sends POST /charges with `headers` and `body` on an HTTP/2 session, and reads the whole answer. */
export function h2post(
  session: http2.ClientHttp2Session,
  headers: Record<string, string>,
  body: string,
): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
    let head: http2.IncomingHttpHeaders = {};
    let text = '';
    stream.setEncoding('utf8');
    stream.on('response', (received) => {
      head = received;
    });
    stream.on('data', (chunk: string) => {
      text += chunk;
    });
    stream.on('end', () => resolve({ status: Number(head[':status']), headers: head, body: text }));
    stream.on('error', reject);
    stream.end(body);
  });
}

/**
 * A self-signed P-256 certificate for localhost, made with openssl in `dir`: for a TLS server that
 * speaks HTTP/2 and HTTP/1.1 (`createSecureServer({ allowHTTP1: true })`).
 */
export function selfSignedCert(dir: string): { key: Buffer; cert: Buffer; keyPath: string; certPath: string } {
  const keyPath = join(dir, 'k.pem');
  const certPath = join(dir, 'c.pem');
  execFileSync(
    'openssl',
    ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1'].concat([
      '-subj',
      '/CN=localhost',
      '-keyout',
      keyPath,
      '-out',
      certPath,
    ]),
    { stdio: 'ignore' },
  );
  return { key: readFileSync(keyPath), cert: readFileSync(certPath), keyPath, certPath };
}

/** Sends POST /charges over HTTPS with HTTP/1.1 to a server using `cert`, and reads the whole answer. */
export function h1post(port: number, headers: Record<string, string>, body: string, cert: Buffer): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const request = https.request(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: '/charges',
        headers,
        ca: cert,
        rejectUnauthorized: false,
        agent: false,
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers as http2.IncomingHttpHeaders, body: text }),
        );
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}
