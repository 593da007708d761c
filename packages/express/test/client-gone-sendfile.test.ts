// A client that leaves while the handler works, then the handler answers with res.sendFile: Express's
// sendFile gives up on a request its client aborted (ECONNABORTED) and ends nothing.
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEvent, memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/express';
import express, { type Response } from 'express';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';

type Callback = (error?: NodeJS.ErrnoException) => void;
const file = fileURLToPath(import.meta.url);

it.each<[string, (res: Response, done: Callback) => void]>([
  ['res.sendFile', (res, done) => res.status(201).sendFile(file, done)],
  // res.download calls res.sendFile.
  ['res.download', (res, done) => res.status(201).download(file, 'export.ts', done)],
])(
  'client gone, the handler answers with %s: the key is kept as a file cut short, not left in progress',
  async (_name, answer) => {
    // sendFile's ECONNABORTED is swallowed (Express's default callback, mirrored below so the test knows
    // when it happened) and the response never ended: unless the capture settles it, the heartbeat renews
    // the lease for as long as the process lives. The operation ran, so the key is kept with 500
    // response_not_replayable, as a stream cut short is.
    const events: IdempotencyEvent[] = [];
    const store = memoryStore();
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    let gaveUp!: (error: unknown) => void;
    const sendFileDone = new Promise<unknown>((resolve) => {
      gaveUp = resolve;
    });
    const app = express();
    app.use(idempotency({ store, scope: () => 'tenant-1', onEvent: (event) => events.push(event) }));
    app.post('/exports', async (req, res, next) => {
      const gone = new Promise((resolve) => req.socket.once('close', resolve));
      started();
      await gone;
      answer(res, (error) => {
        // What Express does without a callback: every error but ECONNABORTED and write errors to next().
        if (error && error.code !== 'ECONNABORTED' && error.syscall !== 'write') next(error);
        setImmediate(gaveUp, error);
      });
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      await abandonedPost(`${url}/exports`, 'gone-file', running);
      expect(((await sendFileDone) as { code?: string } | undefined)?.code).toBe('ECONNABORTED');
      // The memory store settles at once: a settled outcome shows by now.
      expect(events.map((event) => event.type)).not.toEqual(['claim']);
      expect((await store.get(recordId('tenant-1', 'POST /exports', 'gone-file')))?.state).not.toBe('in_progress');
      const retry = await fetch(`${url}/exports`, {
        method: 'POST',
        headers: { 'idempotency-key': 'gone-file', 'content-type': 'application/json' },
        body: '{}',
      });
      expect(retry.status).toBe(500);
      expect(await retry.json()).toMatchObject({ code: 'response_not_replayable' });
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  },
);
