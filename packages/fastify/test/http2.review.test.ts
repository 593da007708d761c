// Review of the HTTP/2 capture (erroredOf/destroyedOf) under Fastify's `http2: true`.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { afterEach, expect, it } from 'vitest';
import { h2post } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Was a defect: over HTTP/2, a hijacked reply the handler destroys without an error (`reply.raw.destroy()`,
// named in docs/guides/fastify.md) leaves the key in progress for good (409 to every retry):
// erroredOf reads the h2 stream's `errored`, which `destroy()` without an error leaves null (a
// ServerResponse's becomes undefined), so the close is taken for a client gone while the handler
// works and nothing settles it; expected: as on HTTP/1.1, the key is released at once
// (`response-not-stored`/`release`) and the retry runs.
it('HTTP/2: a hijacked reply destroyed with reply.raw.destroy() releases the key, so the retry runs', async () => {
  let runs = 0;
  let closed!: () => void;
  const responseClosed = new Promise<void>((resolve) => {
    closed = resolve;
  });
  const events: IdempotencyEvent[] = [];
  const app = Fastify({ http2: true });
  await app.register(idempotency, {
    store: memoryStore(),
    scope: () => 'user_1',
    wait: false,
    onEvent: (e) => events.push(e),
  });
  app.post('/charges', async (_request, reply) => {
    runs++;
    if (runs === 1) {
      reply.hijack();
      reply.raw.once('close', () => setTimeout(closed, 20));
      reply.raw.destroy();
      return reply;
    }
    reply.code(201);
    return { id: `ch_${runs}` };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const session = http2.connect(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(async () => {
    session.destroy();
    await app.close();
  });
  const headers = { 'content-type': 'application/json', 'idempotency-key': 'h2-destroy-1' };
  const first = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
  first.on('error', () => undefined);
  first.resume();
  first.end('{"a":1}');
  await responseClosed;
  expect(events.map((event) => event.type)).toContain('release');
  const retry = await h2post(session, headers, '{"a":1}');
  expect(retry.status).toBe(201);
  expect(runs).toBe(2);
});
