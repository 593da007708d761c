// A client that leaves while the handler works, then the handler streams (or tried to): what the
// capture's watch for a pipe into a closed response (onCapturedClose in packages/core/src/http-capture.ts)
// misses, and what it takes for a pipe when there is none.
import fs from 'node:fs';
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream';
import { memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/express';
import express, { type Request, type Response } from 'express';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';

type Answer = (req: Request, res: Response) => Promise<void>;

/** Runs `answer` once the client of a keyed POST /exports left; resolves with the key's record and a retry. */
async function clientGoneThen(key: string, answer: Answer, before?: Answer) {
  const store = memoryStore();
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let answered!: () => void;
  const done = new Promise<void>((resolve) => {
    answered = resolve;
  });
  const id = recordId('tenant-1', 'POST /exports', key);
  const app = express();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.post('/exports', async (req, res) => {
    const gone = new Promise((resolve) => req.socket.once('close', resolve));
    await before?.(req, res);
    started();
    await gone;
    await answer(req, res);
    answered();
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    await abandonedPost(`${url}/exports`, key, running);
    await done;
    // The capture settles the key once the answer has gone into the closed response: wait for
    // that (a key left in progress fails here, after the poll's timeout) rather than a fixed time.
    await expect.poll(async () => (await store.get(id))?.state, { timeout: 2_000 }).not.toBe('in_progress');
    const record = await store.get(id);
    const retry = await fetch(`${url}/exports`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: '{}',
      signal: AbortSignal.timeout(3000),
    });
    return { state: record?.state, status: retry.status, body: await retry.text() };
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

it('client gone, the handler streams with stream.pipeline(async generator, res): the key is settled, not left in progress', async () => {
  // Was a defect: only a 'pipe' event (or an 'unpipe' listener) tells onCapturedClose a stream went into the closed response, and pipeline() from an async iterable writes without pipe(), so Express's key stays in_progress (409 to every retry) for as long as the process lives.
  const result = await clientGoneThen('gone-generator', async (_req, res) => {
    res.status(201).type('text/plain');
    await new Promise<void>((resolve) => {
      pipeline(
        async function* () {
          yield 'a,b\n';
          yield '1,2\n';
        },
        res,
        () => resolve(),
      );
    });
  });
  expect(result.state).not.toBe('in_progress');
  expect(result.status).not.toBe(409);
});

it('client gone after a pipe whose source failed, the handler answers in full: the answer is stored and replayed', async () => {
  // Was a defect: onCapturedClose takes any 'unpipe' listener on the response for a live pipe, but pipe() leaves its listener behind when its source fails (an ENOENT file stream), so a handler that then answers in full has its answer thrown away as a stream cut short (500 response_not_replayable) instead of stored.
  const result = await clientGoneThen(
    'gone-fallback',
    async (_req, res) => {
      // Built while the client waited, and it left meanwhile.
      res.status(201).json({ built: true });
    },
    // A cached export is tried first; it is missing, so it is built instead.
    async (_req, res) => {
      await new Promise<void>((resolve) => {
        const cached = fs.createReadStream('/nonexistent/export.csv');
        cached.on('error', () => resolve());
        cached.pipe(res);
      });
    },
  );
  expect(result.state).toBe('completed');
  expect(result.status).toBe(201);
  expect(JSON.parse(result.body)).toEqual({ built: true });
});
