// A small request that costs the server more than its size should, found by an audit of algorithmic
// complexity; the test failed when written.
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';
import { send, serve } from './support.js';

// Was a defect: with `fingerprint.exclude` configured, a JSON body nested 200,000 deep (400 KB, under the
// default 1 MiB maxBodyBytes) is answered 500 and the handler never runs: the fingerprint copies the
// parsed body with structuredClone (withoutPointers in packages/core/src/fingerprint.ts), which
// overflows the stack, and the RangeError rejects begin() and reaches Express's final handler.
// Expected: the request is handled (the fingerprint falls back to the body's bytes), or refused 4xx.
it('a deeply nested JSON body with fingerprint.exclude configured is not answered 500', async () => {
  const app = express();
  let ran = 0;
  app.post(
    '/orders',
    idempotency({ store: memoryStore(), scope: () => 'tenant-deep', fingerprint: { exclude: ['/sentAt'] } }),
    (_req, res) => {
      ran++;
      res.status(201).json({ id: 'o_1' });
    },
  );
  const depth = 200_000;
  const body = `{"sentAt":1,"items":${'['.repeat(depth)}${']'.repeat(depth)}}`;
  await serve(app, async (url) => {
    const answer = await send(
      `${url}/orders`,
      'POST',
      [
        ['content-type', 'application/json'],
        ['idempotency-key', '"deep-1"'],
      ],
      body,
    );
    expect(answer.status).toBe(201);
    expect(ran).toBe(1);
  });
});
