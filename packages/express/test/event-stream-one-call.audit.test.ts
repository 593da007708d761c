// Audit (branch audit-atrest): what the store keeps of a server-sent events response. The Express guide
// says "Server-sent events (`text/event-stream`) are never stored: the key is released as soon as the
// stream starts"; the adapter table checks it for a feed written with res.write().
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';

// Was wrong: a feed sent in one call, with no head written before it (res.send, res.end with the
// content type set by setHeader, a write that reaches its Content-Length), reached capturedEnd with its status still unknown, so the live-feed
// check of onHead had not run yet: the feed was stored as an outcome for the whole retention, and a
// retry got its old events replayed instead of a fresh feed.
it.each([
  ['res.type().send()', (res: express.Response, n: number) => res.type('text/event-stream').send(`data: ${n}\n\n`)],
  [
    'setHeader() then res.end()',
    (res: express.Response, n: number) => {
      res.setHeader('content-type', 'text/event-stream');
      res.end(`data: ${n}\n\n`);
    },
  ],
  [
    'a write that reaches the declared length',
    (res: express.Response, n: number) => {
      const body = `data: ${n}\n\n`;
      res.setHeader('content-type', 'text/event-stream');
      res.setHeader('content-length', Buffer.byteLength(body));
      res.write(body);
      res.end();
    },
  ],
])('server-sent events sent in one call (%s) are served and never stored', async (_name, send) => {
  const store = memoryStore();
  const events: IdempotencyEvent[] = [];
  let runs = 0;
  const app = express();
  app.use(idempotency({ store, scope: () => 'tenant-1', onEvent: (event) => events.push(event) }));
  app.post('/events', (_req, res) => {
    send(res, ++runs);
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/events`;
  const post = () => fetch(url, { method: 'POST', headers: { 'idempotency-key': 'sse-1' } });
  try {
    const first = await post();
    expect(first.status).toBe(200);
    expect(await first.text()).toBe('data: 1\n\n');
    expect(store.get(recordId('tenant-1', 'POST /events', 'sse-1'))).toBeUndefined();
    expect(events.find((event) => event.type === 'response-not-stored')).toMatchObject({ reason: 'event-stream' });
    const again = await post();
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(await again.text()).toBe('data: 2\n\n');
  } finally {
    server.close();
  }
});
