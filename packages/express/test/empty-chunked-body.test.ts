// An empty body sent chunked: `Transfer-Encoding: chunked` and only the last chunk (`0\r\n\r\n`), as
// curl `-T -` sends an empty stdin and any client streaming a body of unknown length sends one that
// turns out empty. The middleware reads the body first; with nothing to put back, the request's
// 'end' went out before the body parser listened, and body-parser took the request for one it had
// parsed already: `req.body` was left undefined, where Express alone gives `{}`.
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import express from 'express';
import { expect, it } from 'vitest';
import { postEmptyChunked } from '../../core/test/support/empty-chunked.js';
import { idempotency } from '../src/idempotency.js';

it('an empty chunked body reaches express.json() as an empty body, in one packet with its head or after it', async () => {
  const app = express();
  let runs = 0;
  app.use(idempotency({ store: memoryStore(), scope: () => 'caller' }));
  app.use(express.json());
  app.post('/notes', (req, res) => {
    runs++;
    res.status(201).json({ body: req.body ?? null });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  try {
    for (const later of [false, true]) {
      const key = randomUUID();
      const created = 'HTTP/1.1 201 Created {"body":{}}';
      expect(await postEmptyChunked(port, key, later), `later: ${later}`).toBe(created);
      // The retry is the same request: replayed, not run again.
      expect(await postEmptyChunked(port, key, later), `later: ${later}`).toBe(created);
    }
    expect(runs).toBe(2);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
