import { gunzipSync, gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { expect, it } from 'vitest';
import { idempotency } from '../src/idempotency.js';

// Was a defect, found next to @fastify/compress: a body that is not JSON was fingerprinted by its
// encoded bytes, so the same form compressed twice in two ways (another level, another gzip
// timestamp) was two requests: the honest retry got 422. Express and Koa fingerprinted what the
// body says; Fastify now does too, and hands the encoded bytes on (a later hook decodes them).
it('a compressed body is fingerprinted by what it says, not by its encoded bytes', async () => {
  let runs = 0;
  const app = Fastify();
  // What @fastify/compress does for a request: the parser gets the body decoded.
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'buffer' }, (request, body, done) => {
    const bytes = request.headers['content-encoding'] === 'gzip' ? gunzipSync(body as Buffer) : (body as Buffer);
    done(null, Object.fromEntries(new URLSearchParams(bytes.toString())));
  });
  await app.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
  app.post('/charges', async (request, reply) => {
    runs++;
    reply.code(201);
    return { charged: (request.body as { amount?: string }).amount, run: runs };
  });
  const form = Buffer.from(`amount=42&note=${'x'.repeat(2000)}`);
  const send = (body: Buffer, key: string) =>
    app.inject({
      method: 'POST',
      url: '/charges',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        'content-encoding': 'gzip',
        'idempotency-key': key,
      },
      payload: body,
    });
  const fast = gzipSync(form, { level: 1 });
  const small = gzipSync(form, { level: 9 });
  expect(Buffer.compare(fast, small)).not.toBe(0);
  const first = await send(fast, 'gz-1');
  expect(first.statusCode).toBe(201);
  const retry = await send(small, 'gz-1');
  expect(retry.statusCode).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(runs).toBe(1);
  // Another form under the same key is still another request.
  const other = await send(gzipSync(Buffer.from('amount=43')), 'gz-1');
  expect(other.statusCode).toBe(422);
  await app.close();
});
