// Fastify with `http2: true` (h2c here; `https` with `allowHTTP1` hands its h2 clients the same
// Http2ServerRequest and Http2ServerResponse). The capture wraps `reply.raw`, an Http2ServerResponse.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { pipeline, Readable } from 'node:stream';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { afterEach, expect, it } from 'vitest';
import { h2post } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Was a defect: over HTTP/2, a hijacked reply whose raw response the server destroys before its head
// goes out (`stream.pipeline(source, reply.raw)` whose source fails at once, or
// `reply.raw.destroy()`) leaves the key in progress for as long as the process lives: the heartbeat
// renews the lease, nothing ever settles it, and every retry gets 409 in_progress. The capture tells
// a server-side destroy from a client that left by `res.errored` (and checks `res.destroyed`), which
// an Http2ServerResponse does not have (both stay undefined), so the close is taken for a client
// gone while the handler works. On HTTP/1.1 the same route releases the key at once. Expected (docs/
// guides/fastify.md): "it is not stored and the key is released at once (`response-not-stored`
// with reason `closed`), so the retry runs".
// Was a defect (found by a review of the fixes above): over HTTP/2, a hijacked reply the handler destroys without an error (`reply.raw.destroy()`,
// named in docs/guides/fastify.md) leaves the key in progress for good (409 to every retry):
// erroredOf reads the h2 stream's `errored`, which `destroy()` without an error leaves null (a
// ServerResponse's becomes undefined), so the close is taken for a client gone while the handler
// works and nothing settles it; expected: as on HTTP/1.1, the key is released at once
// (`response-not-stored`/`release`) and the retry runs.
// Since: a body stream that fails before its first chunk keeps the key (the handler ran and handed
// its body over), as on HTTP/1.1: the retry gets 500 response_not_replayable and runs nothing. A
// destroy without an error and without a body stream still releases it.
type ServerDestroy = (raw: NodeJS.WritableStream & { destroy(error?: Error): void }) => void;
const serverDestroys: Array<[string, ServerDestroy, 'kept' | 'released']> = [
  [
    'a failed pipeline',
    (raw) => {
      const failing = new Readable({
        read() {
          this.destroy(new Error('EIO: the file went away'));
        },
      });
      pipeline(failing, raw, () => undefined);
    },
    'kept',
  ],
  ['reply.raw.destroy() without an error', (raw) => raw.destroy(), 'released'],
];
for (const [index, [how, destroy, outcome]] of serverDestroys.entries()) {
  const says = outcome === 'kept' ? 'keeps the key, so the retry runs nothing' : 'releases the key, so the retry runs';
  it(`HTTP/2: a hijacked reply destroyed by ${how} ${says} (not 409)`, async () => {
    let runs = 0;
    let released!: () => void;
    const release = new Promise<void>((resolve) => {
      released = resolve;
    });
    const app = Fastify({ http2: true });
    await app.register(idempotency, {
      store: memoryStore(),
      scope: () => 'user_1',
      onEvent: (event: IdempotencyEvent) => {
        if (event.type === (outcome === 'kept' ? 'complete' : 'release')) released();
      },
    });
    app.post('/charges', async (_request, reply) => {
      runs++;
      if (runs === 1) {
        reply.hijack();
        destroy(reply.raw as never);
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
    const headers = { 'content-type': 'application/json', 'idempotency-key': `h2-destroyed-${index}` };
    const first = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
    first.on('error', () => undefined);
    first.resume();
    first.end('{"a":1}');
    await release;
    const retry = await h2post(session, headers, '{"a":1}');
    if (outcome === 'kept') {
      expect(retry.status).toBe(500);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toMatchObject({ code: 'response_not_replayable' });
      expect(runs).toBe(1);
    } else {
      expect(retry.status).toBe(201);
      expect(runs).toBe(2);
    }
  });
}

// Was a defect: over HTTP/2, a client that cancels its stream mid-upload (RST_STREAM) has the bytes it
// sent so far taken for the whole body: Node's Http2ServerRequest ends its readable side normally
// on an aborted stream (no 'error', as an HTTP/1.1 IncomingMessage gives), so readStream resolves
// `ok` with the truncated body, the key is claimed with its fingerprint, the handler runs with
// `amount=1` of `amount=100` and that outcome is stored. The client's honest retry with the whole
// body is then refused 422 fingerprint_mismatch, for good. Expected: the body is incomplete, nothing
// is claimed (400 body_incomplete, `refused` event), as on HTTP/1.1 and as readRequestBody's own
// comment promises ("nothing is claimed instead", so the client's real retry runs); check
// `req.aborted` / the stream's 'aborted' before taking 'end' for the end of the body.
it('HTTP/2 upload cancelled midway: nothing is claimed, so the retry with the whole body runs (not 422)', async () => {
  const events: IdempotencyEvent[] = [];
  const bodies: string[] = [];
  let settled!: () => void;
  const settledOnce = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const app = Fastify({ http2: true });
  app.addContentTypeParser('text/plain', { parseAs: 'string' }, (_request, body, done) => done(null, body));
  await app.register(idempotency, {
    store: memoryStore(),
    scope: () => 'user_1',
    onEvent: (event) => {
      events.push(event);
      if (event.type !== 'claim') settled();
    },
  });
  app.post('/charges', async (request, reply) => {
    bodies.push(String(request.body));
    reply.code(201);
    return { charged: request.body };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  let received!: () => void;
  const firstBytesIn = new Promise<void>((resolve) => {
    received = resolve;
  });
  app.server.once('stream', (stream: http2.ServerHttp2Stream) => stream.once('data', () => received()));
  const session = http2.connect(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(async () => {
    session.destroy();
    await app.close();
  });
  // No Content-Length: an h2 client streaming a body of unknown length (RFC 9113 8.1.1).
  const headers = { 'content-type': 'text/plain', 'idempotency-key': 'h2-cut-1' };
  const cut = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
  cut.on('error', () => undefined);
  cut.write('amount=1');
  await firstBytesIn;
  // RST_STREAM alone: `cut.close(code)` would end the stream first (END_STREAM), which tells the
  // server the body is complete as sent, as a chunked HTTP/1.1 body's last chunk does.
  cut.destroy();
  // The first event after the claim: 'complete' today; 'refused' (body_incomplete) once fixed.
  await settledOnce;
  expect(events.map((event) => event.type)).not.toContain('complete');
  const retry = await h2post(session, headers, 'amount=100');
  expect(retry.status).toBe(201);
  expect(bodies).not.toContain('amount=1');
});
