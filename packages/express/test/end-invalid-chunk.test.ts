// `res.end` with something Node cannot write (a number, an object) throws at the call, as plain Node does,
// even on a store that settles later: deferred behind the store's answer, the throw would become an
// unhandled rejection (which ends a Node process) and the response a stored empty one.
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';
import { send, serve, withCompletion } from './support.js';

it('res.end(123) throws at the call on a store that settles later, and a fixed answer is what is stored', async () => {
  const inner = memoryStore();
  // Every completion answers on a later turn, as a network store does.
  const store = withCompletion(inner, async (input) => {
    await new Promise((resolve) => setImmediate(resolve));
    return inner.complete(input);
  });
  const rejections: unknown[] = [];
  const onRejection = (reason: unknown) => rejections.push(reason);
  process.on('unhandledRejection', onRejection);
  const events: IdempotencyEvent[] = [];
  const thrown: unknown[] = [];
  const app = express();
  app.post(
    '/charges',
    idempotency({ store, scope: () => 'tenant-1', onEvent: (event) => events.push(event) }),
    (_req, res) => {
      res.status(201);
      try {
        res.end(123 as never);
      } catch (error) {
        thrown.push(error);
      }
      res.status(201).json({ fixed: true });
    },
  );
  try {
    await serve(app, async (url) => {
      const headers: Array<[string, string]> = [
        ['idempotency-key', 'bad-end'],
        ['content-type', 'application/json'],
      ];
      const first = await send(`${url}/charges`, 'POST', headers, '{}');
      expect(first.status).toBe(201);
      expect(first.body).toBe('{"fixed":true}');
      const retry = await send(`${url}/charges`, 'POST', headers, '{}');
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toBe('{"fixed":true}');
    });
    await new Promise((resolve) => setImmediate(resolve));
    expect(thrown).toHaveLength(1);
    expect((thrown[0] as { code?: string }).code).toBe('ERR_INVALID_ARG_TYPE');
    expect(rejections).toEqual([]);
  } finally {
    process.off('unhandledRejection', onRejection);
  }
});
