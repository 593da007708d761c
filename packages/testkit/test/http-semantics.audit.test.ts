// Audit of the HTTP semantics of a replay on all three adapters (Express, Fastify, Koa), with real
// servers on ephemeral ports and memoryStore: less common but valid HTTP from clients and proxies.
// The app is in http-semantics-harness.ts. Checked and found right (not tested here): a gzip body
// replayed to a retry taking identity or br only is decoded; 204 and 304 replay with no body and
// their ETag/Location; a 103 Early Hints before the answer is not stored and not replayed; a chunked
// answer with trailers replays with a Content-Length (its trailers dropped); Date fresh, no Age,
// Transfer-Encoding and Connection not copied; the key echoed as spelled (sf parameters included);
// Expect: 100-continue claims nothing until the body has arrived.
import { afterEach, describe, expect, it } from 'vitest';
import { type App, frameworks, send, startApp } from './http-semantics-harness.js';

let app: App | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

describe.each(frameworks)('replay headers a status requires (%s)', (framework) => {
  // Was a defect: a stored 206 Partial Content is replayed without its Content-Range. RFC 9110 15.3.7.1:
  // a server generating a single-part 206 MUST send Content-Range; without it the client cannot
  // place the bytes (the replay says 206 and carries 4 bytes of a 10-byte representation with no
  // range). Expected: a replay of a 206 keeps Content-Range (it describes the stored bytes, like
  // Content-Type; it is not per-request), on all three frameworks alike. Express's res.sendFile
  // answers a POST carrying Range with such a 206 (see packages/express/test/send-file-range.audit.test.ts).
  it('a stored 206 replays with its Content-Range (RFC 9110 15.3.7)', async () => {
    app = await startApp(framework);
    const first = await send(app, { key: 'partial-1', headers: { 'x-act': '206' } });
    expect(first.status).toBe(206);
    expect(first.headers['content-range']).toBe('bytes 0-3/10');
    const again = await send(app, { key: 'partial-1', headers: { 'x-act': '206' } });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.status).toBe(206);
    expect(again.body.toString()).toBe('ran ');
    expect(again.headers['content-range']).toBe('bytes 0-3/10');
  });

  // Was a defect: a stored 405 Method Not Allowed (a handler's answer, stored like any 4xx under the
  // default policy 'all') is replayed without its Allow header. RFC 9110 15.5.6: the origin server
  // MUST generate Allow in a 405. Expected: the replay keeps Allow (it is about the resource, not
  // the request), as the first answer had it.
  it('a stored 405 replays with its Allow (RFC 9110 15.5.6)', async () => {
    app = await startApp(framework);
    const first = await send(app, { method: 'PUT', key: 'allow-1', headers: { 'x-act': '405' } });
    expect(first.status).toBe(405);
    expect(first.headers.allow).toBe('POST');
    const again = await send(app, { method: 'PUT', key: 'allow-1', headers: { 'x-act': '405' } });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.status).toBe(405);
    expect(again.headers.allow).toBe('POST');
  });
});

describe('absolute-form request target (RFC 9112 3.2.2), as a forward proxy sends it', () => {
  const absolute = (a: App) => `http://127.0.0.1:${a.port}/r`;

  // Express and Koa fingerprint the path of an absolute-form target: the same request in either
  // form is one request, and its retry replays. (Pins: these pass.)
  for (const framework of ['express', 'koa'] as const) {
    it(`${framework}: a retry in origin form of a request sent in absolute form replays`, async () => {
      app = await startApp(framework);
      const first = await send(app, { key: 'abs-1', path: absolute(app) });
      expect(first.status).toBe(201);
      const again = await send(app, { key: 'abs-1', path: '/r' });
      expect(again.status).toBe(201);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(app.runs()).toBe(1);
    });
  }

  // Was a defect (Fastify only): the Fastify adapter takes the concrete path from `request.url`, the raw
  // request target, so an absolute-form target (`POST http://host/r`, which RFC 9112 3.2.2 says a
  // server MUST accept, and which Fastify routes to the same handler) is fingerprinted with its
  // scheme and authority. The same request retried in origin form (the client now bypasses the
  // proxy, or the proxy rewrote it) is answered 422 fingerprint_mismatch, where Express and Koa
  // replay it. docs/concepts.md: the fingerprint is over the "concrete path"; DESIGN.md: one
  // scenario table, three frameworks, identical results. Expected: replay, as on Express and Koa.
  it('fastify: a retry in origin form of a request sent in absolute form replays, as on Express and Koa', async () => {
    app = await startApp('fastify');
    const first = await send(app, { key: 'abs-1', path: absolute(app) });
    expect(first.status).toBe(201);
    const again = await send(app, { key: 'abs-1', path: '/r' });
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(app.runs()).toBe(1);
  });
});
