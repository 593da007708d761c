// An empty body sent chunked: `Transfer-Encoding: chunked` and only the last chunk (`0\r\n\r\n`), as
// curl `-T -` sends an empty stdin and any client streaming a body of unknown length sends one that
// turns out empty. The middleware reads the body first; with nothing to put back, the request's
// 'end' went out before the body parser listened, and body-parser took the request for one it had
// parsed already: `req.body` was left undefined, where Express alone gives `{}`.
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:net';
import { memoryStore } from '@idem/core';
import express from 'express';
import { expect, it } from 'vitest';
import { idempotency } from '../src/idempotency.js';

/** The status line and body of the answer to an empty chunked POST, its last chunk sent `later` or not. */
function postEmptyChunked(port: number, key: string, later: boolean): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    let answer = '';
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1');
    });
    socket.on('end', () => {
      const [head = '', body = ''] = answer.split('\r\n\r\n');
      resolve(`${head.split('\r\n')[0]} ${body}`);
    });
    socket.on('error', reject);
    const head =
      `POST /notes HTTP/1.1\r\nHost: x\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n` +
      'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
    if (!later) socket.write(`${head}0\r\n\r\n`);
    else {
      socket.write(head);
      setTimeout(() => socket.write('0\r\n\r\n'), 20);
    }
  });
}

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
