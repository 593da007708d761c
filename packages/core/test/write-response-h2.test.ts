import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { expect, it } from 'vitest';
import { type HttpResponse, writeResponse } from '../src/index.js';

// A response stored from an HTTP/1.1 answer (a third-party store, an older version) may carry fields
// about one connection, which Node refuses on an HTTP/2 response (RFC 9113 8.2.2): written as they
// are, every HTTP/2 replay of it would be a 500. writeResponse leaves them out there.
it('writes a response holding connection-specific fields to an HTTP/2 client, without them', async () => {
  const stored: HttpResponse = {
    status: 201,
    headers: { 'content-type': 'text/plain', upgrade: 'TLS/1.3', 'keep-alive': 'timeout=5', etag: '"v1"' },
    body: Buffer.from('created'),
  };
  const server = http2.createServer((_req, res) => writeResponse(res as never, stored));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    const answer = await new Promise<{ headers: http2.IncomingHttpHeaders; body: string }>((resolve, reject) => {
      const stream = session.request({ ':path': '/' });
      let headers: http2.IncomingHttpHeaders = {};
      let body = '';
      stream.setEncoding('utf8');
      stream.on('response', (received) => {
        headers = received;
      });
      stream.on('data', (chunk: string) => {
        body += chunk;
      });
      stream.on('end', () => resolve({ headers, body }));
      stream.on('error', reject);
      stream.end();
    });
    expect(answer.headers[':status']).toBe(201);
    expect(answer.body).toBe('created');
    expect(answer.headers.etag).toBe('"v1"');
    expect(answer.headers.upgrade).toBeUndefined();
    expect(answer.headers['keep-alive']).toBeUndefined();
  } finally {
    session.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});
