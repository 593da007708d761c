// `stream.pipeline(source, res, next)`: the callback form that hands the pipeline's error to Express,
// when the body source fails before its first chunk. The pipeline destroys the response with the
// source's error (nothing of the answer went out; the client sees its connection cut), then Express's
// error handling runs: finalhandler, or the app's own handler, writes a 500 on the destroyed response.
// That 500 never reached anyone. The rule: the handler ran, so its key is kept, and the retry gets
// `500 response_not_replayable` (the operation ran, its answer is lost), never a stored 500 the
// client never saw, and never a second run.
import fs from 'node:fs';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline, Readable } from 'node:stream';
import { type IdempotencyEvent, type IdempotencyOptions, memoryStore } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import { transactionalMemoryStore } from '@idem/testkit';
import express, { type ErrorRequestHandler } from 'express';
import { describe, expect, it } from 'vitest';

// A source that fails on its first read, as a stream of a file gone missing mid-way does.
const failsOnRead = () =>
  new Readable({
    read() {
      this.destroy(Object.assign(new Error('EIO (injected)'), { code: 'EIO' }));
    },
  });
// A file that is not there: its error comes after the open fails, a turn later.
const missingFile = () => fs.createReadStream('/nonexistent/idem-audit/export.csv');

const sources: Array<[string, () => Readable]> = [
  ['fails on its first read', failsOnRead],
  ['a missing file', missingFile],
];

// The app's own error handler, of the usual shape: an answer for any error.
const ownErrorHandler: ErrorRequestHandler = (_error, _req, res, _next) => {
  res.status(500).json({ error: 'export_failed' });
};

const handlers: Array<[string, Array<ErrorRequestHandler>]> = [
  ['finalhandler', []],
  ['idempotencyErrors() then finalhandler', [idempotencyErrors()]],
  ['the app’s own error handler', [ownErrorHandler]],
  ['idempotencyErrors() then the app’s own error handler', [idempotencyErrors(), ownErrorHandler]],
];

async function exportFails(
  key: string,
  source: () => Readable,
  errorHandlers: ErrorRequestHandler[],
  options: Partial<IdempotencyOptions> & { transactional?: boolean } = {},
) {
  let runs = 0;
  const events: IdempotencyEvent[] = [];
  let nexted!: () => void;
  const errorHandled = new Promise<void>((resolve) => {
    nexted = resolve;
  });
  const app = express();
  app.use(
    idempotency({
      store: options.transactional === true ? transactionalMemoryStore() : memoryStore(),
      scope: () => 'tenant-1',
      lease: '1h',
      onEvent: (event) => events.push(event),
      ...options,
    }),
  );
  app.post('/exports', (_req, res, next) => {
    res.status(201).type('text/csv');
    if (++runs > 1) return void res.send('second run');
    pipeline(source(), res, (error) => {
      next(error);
      // Express's error handling is synchronous from here on (finalhandler defers its write by a
      // turn at most): the outcome is settled when the client's retry comes.
      setImmediate(nexted);
    });
  });
  for (const handler of errorHandlers) app.use(handler);
  // Quiet: finalhandler logs the error otherwise.
  app.set('env', 'test');
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    const first = await new Promise<{ status: number } | { failed: string }>((resolve) => {
      const req = httpRequest(`${url}/exports`, {
        method: 'POST',
        agent: false,
        headers: { 'idempotency-key': key, 'content-type': 'application/json', 'content-length': '2' },
      });
      req.on('error', (error) => resolve({ failed: error.message }));
      req.on('response', (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0 }));
        res.on('error', (error) => resolve({ failed: error.message }));
      });
      req.end('{}');
    });
    await errorHandled;
    const retry = await fetch(`${url}/exports`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: '{}',
      signal: AbortSignal.timeout(5000),
    });
    return {
      first,
      runs,
      status: retry.status,
      replayed: retry.headers.get('idempotent-replayed'),
      body: await retry.text(),
      notStored: events.filter((event) => event.type === 'response-not-stored'),
    };
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe('stream.pipeline(source, res, next) whose source fails before its first chunk', () => {
  for (const [sourceName, source] of sources) {
    for (const [handlerName, errorHandlers] of handlers) {
      it(`${sourceName}, ${handlerName}: the client's connection is cut; the retry gets 500 response_not_replayable, never the 500 nobody saw`, async () => {
        const result = await exportFails(`pn-${sourceName.length}-${handlerName.length}`, source, errorHandlers);
        // Nothing of an answer reached the client: the response was destroyed before its head.
        expect(result.first).toHaveProperty('failed');
        expect(result.notStored).toMatchObject([{ reason: 'streaming', status: 201 }]);
        expect(result.status).toBe(500);
        expect(result.replayed).toBe('true');
        expect(JSON.parse(result.body)).toMatchObject({ code: 'response_not_replayable' });
        expect(result.runs).toBe(1);
      });
    }
  }

  it("storeOutcome 'stripe', idempotencyErrors(): kept as well, the error handed to next() is no thrown handler here", async () => {
    // 'stripe' releases a thrown handler. But the outcome is settled at the response's close, which
    // the pipeline's callback comes after (it waits for every stream to close), so the next(error)
    // that follows is too late to count: the handler ran and handed over its body, and that body
    // failed, as a stream failing after its head is judged by the status it was sent with.
    const result = await exportFails('pn-stripe', failsOnRead, [idempotencyErrors()], { storeOutcome: 'stripe' });
    expect(result.first).toHaveProperty('failed');
    expect(result.notStored).toMatchObject([{ reason: 'streaming', status: 201 }]);
    expect(result.status).toBe(500);
    expect(JSON.parse(result.body)).toMatchObject({ code: 'response_not_replayable' });
    expect(result.runs).toBe(1);
  });

  it('transactional: the transaction rolls back and the key is released, so the retry runs', async () => {
    const result = await exportFails('pn-tx', failsOnRead, [idempotencyErrors()], { transactional: true });
    expect(result.first).toHaveProperty('failed');
    expect(result.notStored).toMatchObject([{ reason: 'streaming', status: 201 }]);
    expect(result.status).toBe(201);
    expect(result.replayed).toBeNull();
    expect(result.body).toBe('second run');
    expect(result.runs).toBe(2);
  });
});
