// A body stream piped into the response, then unpiped by the handler (it chose to answer whole
// instead: a cached copy turned out stale, a size check failed), while the source stays open. The
// client leaves before the whole answer; the handler still ends the response, as a working handler
// may. Nothing is piped into the response any more, so the close is a client that left, no stream cut
// short: the handler's whole answer is stored and the retry gets it replayed, as if it never piped.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { afterEach, describe, expect, it } from 'vitest';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

function post(port: number, key: string, leaveWhen?: Promise<void>) {
  return new Promise<{ status: number; headers: Record<string, unknown>; body: string } | undefined>(
    (resolve, reject) => {
      const req = httpRequest(
        { host: '127.0.0.1', port, method: 'POST', path: '/orders', headers: { 'idempotency-key': key } },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            body += chunk;
          });
          res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        },
      );
      req.on('error', (error) => (leaveWhen === undefined ? reject(error) : resolve(undefined)));
      req.end();
      void leaveWhen?.then(() => {
        req.destroy();
        resolve(undefined);
      });
    },
  );
}

describe('a body stream piped, then unpiped, then the response answered whole', () => {
  it('a client that left in between: the whole answer is stored, the retry gets it replayed', async () => {
    let runs = 0;
    const events: IdempotencyEvent[] = [];
    let unpiped!: () => void;
    const unpipedNow = new Promise<void>((resolve) => {
      unpiped = resolve;
    });
    let settled!: () => void;
    const settledNow = new Promise<void>((resolve) => {
      settled = resolve;
    });
    const app = express();
    app.use(
      idempotency({
        store: memoryStore(),
        scope: () => 'tenant-1',
        lease: '1h',
        onEvent: (event) => {
          events.push(event);
          if (event.type === 'complete' || event.type === 'release') settled();
        },
      }),
    );
    app.post('/orders', (_req, res) => {
      if (++runs > 1) return void res.status(201).send('second run');
      const source = new Readable({ read() {} });
      source.pipe(res);
      source.unpipe(res);
      unpiped();
      // The handler answers whole once its client has gone (the close is what this is about).
      res.once('close', () => {
        setImmediate(() => {
          res.status(201).end('whole answer');
          source.destroy();
        });
      });
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    closers.push(() => new Promise((resolve) => server.close(() => resolve())));
    const { port } = server.address() as AddressInfo;

    const key = 'order-unpiped-1';
    expect(await post(port, key, unpipedNow)).toBeUndefined();
    await settledNow;
    const retry = await post(port, key);
    expect(events.filter((event) => event.type === 'response-not-stored')).toEqual([]);
    expect(retry).toMatchObject({ status: 201, body: 'whole answer' });
    expect(retry?.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
  }, 20_000);
});
