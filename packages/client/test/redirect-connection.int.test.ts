// A read's redirect is followed on the connection it came on. The 3xx's body is nobody's answer, but
// cancelling it makes undici close the socket whenever the body has not fully arrived, so every hop
// cost a new connection (a TCP handshake, and a TLS one on https). It is drained as a retried
// `parse: 'none'` body is (drain-body.ts): read to its end up to 64 KiB, given up beyond.
import type { ServerResponse } from 'node:http';
import { createClient } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { closeServers, serve } from './support/logging-server.js';

afterEach(closeServers);

// The body follows its headers a moment later, as it does whenever a server streams or the network
// splits them: a body still on its way when it is cancelled costs the connection.
function later(res: ServerResponse, send: () => void) {
  res.flushHeaders();
  setTimeout(send, 5);
}

describe("a read's redirect", () => {
  it('Was wrong: its body was cancelled, closing the socket; it is drained and one connection serves the chain', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/x' || req.url === '/y') {
        const body = `moved to ${req.url === '/x' ? '/y' : '/z'}\n`.repeat(50);
        res.writeHead(req.url === '/x' ? 302 : 307, {
          location: req.url === '/x' ? '/y' : '/z',
          'content-type': 'text/plain',
          'content-length': String(body.length),
        });
        later(res, () => res.end(body));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    });
    const result = await createClient({ baseUrl: s.url }).get('/x');
    expect(result.body).toEqual({ ok: true });
    expect(s.log.map((seen) => seen.url)).toEqual(['/x', '/y', '/z']);
    expect(s.connections()).toBe(1);
  });

  it('Was wrong: a chunked body (no Content-Length) is drained too', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/x') {
        res.writeHead(301, { location: '/y', 'content-type': 'text/plain' });
        res.write('moved ');
        later(res, () => res.end('to /y'));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' }).end('here');
    });
    const result = await createClient({ baseUrl: s.url }).get('/x');
    expect(result.body).toBe('here');
    expect(s.connections()).toBe(1);
  });

  it('a body declared over the cap (64 KiB) is cancelled unread, and the redirect still followed', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/x') {
        res.writeHead(302, { location: '/y', 'content-length': String(2 ** 20) });
        later(res, () => res.end(Buffer.alloc(2 ** 20)));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' }).end('here');
    });
    const result = await createClient({ baseUrl: s.url }).get('/x');
    expect(result.body).toBe('here');
    expect(s.connections()).toBeGreaterThanOrEqual(2);
  });

  it('a body that stalls is given up soon (250 ms), not held until the attempt times out', async () => {
    const s = await serve((req, res) => {
      if (req.url === '/x') {
        res.writeHead(302, { location: '/y', 'content-type': 'text/plain' });
        res.write('half'); // and never the rest
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain' }).end('here');
    });
    const client = createClient({ baseUrl: s.url, retry: { timeout: '10s', maxAttempts: 1 } });
    const started = performance.now();
    const result = await client.get('/x');
    expect(result.body).toBe('here');
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(s.connections()).toBeGreaterThanOrEqual(2);
  }, 5_000);
});
