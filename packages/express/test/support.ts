// What the Express test files share.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Store } from '@idem/core';
import type { Express } from 'express';

/** Runs `run` against `app` listening on an ephemeral loopback port, then closes every connection. */
export async function serve(app: Express, run: (url: string) => Promise<void>) {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

/** What a raw client received. */
export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/**
 * A request with a raw header list, so a header can be sent twice. The body goes out in `chunks`,
 * one write each; without `contentLength` it goes out chunked.
 */
export function send(
  url: string,
  method: string,
  headers: Array<[string, string]>,
  chunks: string | readonly string[] = '',
  contentLength = true,
): Promise<Answer> {
  const parts = typeof chunks === 'string' ? [chunks] : chunks;
  const length: Array<[string, string]> = contentLength
    ? [['content-length', String(Buffer.byteLength(parts.join('')))]]
    : [];
  const flat = [['host', new URL(url).host], ...length, ...headers].flat();
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method, agent: false, headers: flat as unknown as Record<string, string> },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
      },
    );
    req.on('error', reject);
    for (const part of parts) req.write(part);
    req.end();
  });
}

/**
 * `inner` with its completion answered by `complete` (which calls on to `inner` when it is ready), and
 * every other method passed on: a store that settles an outcome later, as a network store does.
 */
export function withCompletion(inner: Store, complete: Store['complete']): Store {
  return {
    ...inner,
    claim: (input) => inner.claim(input),
    renew: (input) => inner.renew(input),
    release: (input) => inner.release(input),
    get: (id) => inner.get(id),
    complete,
  };
}
