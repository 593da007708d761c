// Audit: a Range header on a keyed POST whose handler answers with res.sendFile. Express's `send`
// honours Range (and If-Match, If-None-Match) whatever the method, so the stored outcome is a 206
// of part of the file. Range is not in the fingerprint (docs/concepts.md lists method, route, path,
// query, media type and body), so a retry without Range replays that 206: documented, a judgment
// call. What the replay then says is the defect.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { memoryStore } from '@idem/core';
import express from 'express';
import { afterAll, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';

const dir = mkdtempSync(join(tmpdir(), 'idem-range-'));
const file = join(dir, 'receipt.txt');
writeFileSync(file, '0123456789');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function post(port: number, headers: Record<string, string>) {
  return new Promise<{ status: number; headers: IncomingHttpHeaders; body: string }>((resolve, reject) => {
    const req = httpRequest(
      { host: '127.0.0.1', port, method: 'POST', path: '/receipts', agent: false, headers },
      (res) => {
        let body = '';
        res.setEncoding('latin1');
        res.on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

// Was a defect: the first answer is `206` with `Content-Range: bytes 0-3/10`; its replay is `206` with
// the same 4 bytes and no Content-Range, which RFC 9110 15.3.7.1 says a single-part 206 MUST carry.
// The client of the retry, which sent no Range, gets a partial body it cannot tell from the whole.
// Expected: the replay keeps Content-Range.
it('res.sendFile answering a POST with Range: the replayed 206 keeps its Content-Range', async () => {
  let runs = 0;
  const app = express();
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
  app.post('/receipts', (_req, res) => {
    runs++;
    res.sendFile(file);
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const port = (server.address() as AddressInfo).port;
  try {
    const first = await post(port, { 'idempotency-key': 'receipt-1', range: 'bytes=0-3' });
    expect(first.status).toBe(206);
    expect(first.headers['content-range']).toBe('bytes 0-3/10');
    const again = await post(port, { 'idempotency-key': 'receipt-1' });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
    expect(again.status).toBe(206);
    expect(again.body).toBe('0123');
    expect(again.headers['content-range']).toBe('bytes 0-3/10');
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
