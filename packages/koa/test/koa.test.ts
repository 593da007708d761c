import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { type IdempotencyEvent, memoryStore, resolveOutcomePolicy } from '@idem/core';
import { idempotency, type KoaIdempotencyOptions } from '@idem/koa';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { replaysCompressedJson } from '../../core/test/support/compressed-json.js';
import { captureWarnings } from '../../core/test/support/warnings.js';
import { abandonedPost, clientLeaves, eventLog, listen } from './support.js';

async function serve(
  options: Partial<KoaIdempotencyOptions>,
  handler: Koa.Middleware,
  run: (url: string) => Promise<void>,
) {
  const app = new Koa();
  app.use(async (ctx, next) => {
    ctx.set('access-control-allow-origin', 'https://app.example');
    await next();
  });
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', ...options }));
  app.use(handler);
  await listen(app, run);
}

const post = (url: string, key: string) =>
  fetch(url, { method: 'POST', headers: { 'idempotency-key': key, 'content-type': 'application/json' }, body: '{}' });

// A post whose client leaves once the handler runs: its outcome is not stored (for `reason`), the key
// is released, and the retry runs as the second execution.
async function abandonedThenRuns(
  url: string,
  key: string,
  started: Promise<void>,
  log: ReturnType<typeof eventLog>,
  reason: string,
) {
  await abandonedPost(url, key, started);
  expect(await log.next(0, 'response-not-stored')).toMatchObject({ reason });
  await log.next(0, 'release');
  const retry = await post(url, key);
  expect(retry.status).toBe(200);
  expect(await retry.json()).toEqual({ run: 2 });
}

// A body reader as @koa/bodyparser (co-body) is one: reads ctx.req, inflates what its
// Content-Encoding says, and parses the JSON.
async function inflatedJson(ctx: Koa.Context): Promise<unknown> {
  const decoders: Record<string, () => NodeJS.ReadWriteStream> = {
    gzip: createGunzip,
    deflate: createInflate,
    br: createBrotliDecompress,
  };
  const encoding = ctx.get('content-encoding').toLowerCase();
  const decoder = decoders[encoding];
  const stream = decoder ? ctx.req.pipe(decoder()) : ctx.req;
  return JSON.parse((await buffer(stream)).toString('utf8'));
}

describe('@idem/koa specifics', () => {
  it('a route the middleware is not mounted on takes a key as any other header: nothing claimed, stored or echoed (29)', async () => {
    const events: IdempotencyEvent[] = [];
    const app = new Koa();
    const guarded = idempotency({ store: memoryStore(), scope: () => 'tenant-1', onEvent: (e) => events.push(e) });
    let runs = 0;
    app.use(async (ctx, next) => {
      // Only /charges opts in; /notes never sees the middleware.
      if (ctx.path === '/charges') return guarded(ctx, next);
      return next();
    });
    app.use(async (ctx) => {
      ctx.status = 201;
      ctx.body = { path: ctx.path, run: ++runs };
    });
    await listen(app, async (url) => {
      for (const run of [1, 2]) {
        const answer = await post(`${url}/notes`, 'k-29');
        expect(answer.headers.get('idempotency-key')).toBeNull();
        expect(answer.headers.get('idempotent-replayed')).toBeNull();
        expect(await answer.json()).toEqual({ path: '/notes', run });
      }
      expect(events).toEqual([]);
      expect((await post(`${url}/charges`, 'k-29')).headers.get('idempotency-key')).toBe('k-29');
      expect((await post(`${url}/charges`, 'k-29')).headers.get('idempotent-replayed')).toBe('true');
    });
  });

  it('an app-wide instance and a route instance on one request: the first governs, the second steps aside and warns once', async () => {
    const inner: IdempotencyEvent[] = [];
    const routeInstance = idempotency({
      store: memoryStore(),
      scope: () => 'tenant-1',
      retention: '48h',
      onEvent: (event) => inner.push(event),
    });
    let runs = 0;
    const warnings = captureWarnings();
    try {
      await serve(
        {},
        (ctx, next) =>
          routeInstance(ctx, async () => {
            runs++;
            ctx.status = 201;
            ctx.body = { id: `ch_${runs}` };
          }).then(() => next()),
        async (url) => {
          // Before, the route instance claimed the key the app-wide one held: 409 for every first request.
          expect((await post(url, 'stacked-1')).status).toBe(201);
          const again = await post(url, 'stacked-1');
          expect(again.status).toBe(201);
          expect(again.headers.get('idempotent-replayed')).toBe('true');
          expect((await post(url, 'stacked-2')).status).toBe(201);
        },
      );
    } finally {
      warnings.stop();
    }
    expect(runs).toBe(2);
    expect(inner).toEqual([]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(warnings.withCode('IDEM_STACKED')).toHaveLength(1);
  });

  it("knows when the handler threw: policy 'stripe' releases the key instead of storing the 500", async () => {
    let runs = 0;
    const events: IdempotencyEvent[] = [];
    await serve(
      { storeOutcome: 'stripe', onEvent: (event) => events.push(event) },
      async () => {
        runs++;
        throw new Error('failed');
      },
      async (url) => {
        expect((await post(url, 'b-1')).status).toBe(500);
        const again = await post(url, 'b-1');
        expect(again.status).toBe(500);
        expect(again.headers.get('idempotent-replayed')).toBeNull();
        expect(runs).toBe(2);
        expect(events.filter((event) => event.type === 'not-stored').length).toBe(2);
      },
    );
  });

  it('a compressed body is fingerprinted by what it decodes to: gzipped again, deflated, br or plain, the same JSON replays', async () => {
    const seen: unknown[] = [];
    await serve(
      {},
      async (ctx) => {
        // After idem (mounted before it), the body reader still gets the compressed bytes and inflates them.
        const body = (await inflatedJson(ctx)) as { amount: number };
        seen.push(body);
        ctx.status = 201;
        ctx.body = { id: 'ch_1', amount: body.amount };
      },
      (url) => replaysCompressedJson(url, seen),
    );
  });

  it('exposes the execution on ctx.state.idempotency (key, minted)', async () => {
    await serve(
      {},
      async (ctx) => {
        ctx.status = 201;
        ctx.body = { key: ctx.state.idempotency?.key, minted: ctx.state.idempotency?.minted };
      },
      async (url) => {
        const first = await post(url, '"k-1"');
        expect(await first.json()).toEqual({ key: 'k-1', minted: false });
        const again = await post(url, '"k-1"');
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        // Headers earlier middleware set (CORS) stay on replays and problems.
        expect(again.headers.get('access-control-allow-origin')).toBe('https://app.example');
        const problem = await fetch(url, { method: 'POST', body: '{}' });
        expect(problem.status).toBe(400);
        expect(problem.headers.get('access-control-allow-origin')).toBe('https://app.example');
      },
    );
  });
  it('client gone, body a Blob, web ReadableStream or Response: never stored as "{}"; the key is kept and the retry gets 500 response_not_replayable', async () => {
    const bodies: Record<string, () => unknown> = {
      Blob: () => new Blob(['hello from a blob'], { type: 'text/plain' }),
      ReadableStream: () =>
        new ReadableStream({
          start(controller) {
            controller.enqueue(new TextEncoder().encode('hello from a web stream'));
            controller.close();
          },
        }),
      Response: () => new Response('hello from a Response', { headers: { 'content-type': 'text/plain' } }),
    };
    for (const [name, make] of Object.entries(bodies)) {
      const log = eventLog();
      let runs = 0;
      const leaving = clientLeaves();
      await serve(
        { onEvent: log.onEvent },
        async (ctx) => {
          runs++;
          // The first client leaves while the handler works; the body is set once it has gone.
          if (runs === 1) await leaving.untilGone(ctx);
          ctx.status = 200;
          ctx.body = make();
        },
        async (url) => {
          await abandonedPost(url, `web-${name}`, leaving.running);
          expect(await log.next(0, 'response-not-stored'), name).toMatchObject({ reason: 'streaming', status: 200 });
          // The operation ran: its key is kept, with what a retry gets in place of the body.
          const settled = await log.next(0, 'complete', 'release');
          expect(settled, name).toMatchObject({ type: 'complete', status: 500 });
          const retry = await post(url, `web-${name}`);
          expect(retry.status, name).toBe(500);
          expect(retry.headers.get('idempotent-replayed'), name).toBe('true');
          expect(await retry.json(), name).toMatchObject({ code: 'response_not_replayable' });
          expect(runs, name).toBe(1);
        },
      );
    }
  });

  it('client gone, a handler that said it had no effect (release()): its answer is not stored, and the retry runs', async () => {
    const log = eventLog();
    const leaving = clientLeaves();
    let runs = 0;
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        runs++;
        if (runs === 1) {
          await leaving.untilGone(ctx);
          ctx.state.idempotency?.release();
          ctx.status = 503;
          ctx.body = { error: 'try_later' };
          return;
        }
        ctx.status = 201;
        ctx.body = { run: runs };
      },
      async (url) => {
        await abandonedPost(url, 'gone-said', leaving.running);
        expect(await log.next(0, 'not-stored')).toMatchObject({ status: 503 });
        const retry = await post(url, 'gone-said');
        expect([retry.status, retry.headers.get('idempotent-replayed')]).toEqual([201, null]);
        expect(runs).toBe(2);
      },
    );
  });

  it('client gone, a body over maxResponseBytes: not stored, and (as when written) its key kept with 500 response_not_replayable', async () => {
    const log = eventLog();
    const leaving = clientLeaves();
    let runs = 0;
    await serve(
      { onEvent: log.onEvent, maxResponseBytes: 100 },
      async (ctx) => {
        runs++;
        await leaving.untilGone(ctx);
        ctx.status = 201;
        ctx.body = 'x'.repeat(500);
      },
      async (url) => {
        await abandonedPost(url, 'gone-big', leaving.running);
        expect(await log.next(0, 'response-not-stored')).toMatchObject({ reason: 'too-large', status: 201 });
        expect(await log.next(0, 'complete', 'release')).toMatchObject({ type: 'complete', status: 500 });
        const retry = await post(url, 'gone-big');
        expect([retry.status, retry.headers.get('idempotent-replayed')]).toEqual([500, 'true']);
        expect(runs).toBe(1);
      },
    );
  });

  it('client gone before a request no route took ends: nothing is stored, and the release says no-route', async () => {
    const log = eventLog();
    const leaving = clientLeaves();
    await serve(
      { onEvent: log.onEvent },
      // A not-found middleware that is slow to decide: Koa's own 404 follows, with nobody left to hear it.
      async (ctx) => {
        await leaving.untilGone(ctx);
      },
      async (url) => {
        await abandonedPost(url, 'nowhere-1', leaving.running);
        expect((await log.next(0, 'complete', 'release')).type).toBe('release');
        expect(log.events.find((event) => event.type === 'response-not-stored')).toMatchObject({
          reason: 'no-route',
          status: 404,
        });
      },
    );
  });

  it('client gone, a body Koa writes from memory: what is stored is what Koa would have written', async () => {
    const cases: { name: string; set: (ctx: Koa.Context) => void }[] = [
      {
        // A Uint8Array that is not a Buffer: Koa writes it as JSON, like any object.
        name: 'Uint8Array',
        set: (ctx) => {
          ctx.body = new Uint8Array([1, 2, 3]);
        },
      },
      {
        // A status without a body: Koa writes the status message as text.
        name: 'status-only',
        set: (ctx) => {
          ctx.status = 202;
        },
      },
      {
        name: 'object',
        set: (ctx) => {
          ctx.body = { ok: true };
        },
      },
      {
        name: 'Buffer',
        set: (ctx) => {
          ctx.type = 'application/octet-stream';
          ctx.body = Buffer.from([104, 105]);
        },
      },
      {
        // A null body set on purpose, then a status that has a body: Koa writes nothing at all.
        name: 'explicit null body',
        set: (ctx) => {
          ctx.body = null;
          ctx.status = 200;
        },
      },
      {
        // A body set after a status that has none: Koa drops the body and its type.
        name: '205 with a body',
        set: (ctx) => {
          ctx.status = 205;
          ctx.body = 'dropped';
        },
      },
      {
        name: '204 with a body',
        set: (ctx) => {
          ctx.status = 204;
          ctx.body = 'dropped';
        },
      },
      {
        name: 'header set as a list',
        set: (ctx) => {
          ctx.set('x-parts', ['a', 'b']);
          ctx.body = 'parts';
        },
      },
    ];
    for (const { name, set } of cases) {
      const slug = name.replace(/\W+/g, '-');
      const log = eventLog();
      let runs = 0;
      const leaving = clientLeaves();
      await serve(
        { onEvent: log.onEvent, replayHeaders: ['x-parts'] },
        async (ctx) => {
          runs++;
          if (ctx.get('x-stay') === '') await leaving.untilGone(ctx);
          set(ctx);
        },
        async (url) => {
          // What a client that stays gets, under another key.
          const stayed = await fetch(url, {
            method: 'POST',
            headers: { 'idempotency-key': `stay-${slug}`, 'content-type': 'application/json', 'x-stay': '1' },
            body: '{}',
          });
          const expected = {
            status: stayed.status,
            type: stayed.headers.get('content-type'),
            parts: stayed.headers.get('x-parts'),
            body: await stayed.text(),
          };
          const mark = log.events.length;
          await abandonedPost(url, `gone-${slug}`, leaving.running);
          expect((await log.next(mark, 'complete', 'release')).type, name).toBe('complete');
          const replay = await post(url, `gone-${slug}`);
          expect(replay.headers.get('idempotent-replayed'), name).toBe('true');
          expect(
            {
              status: replay.status,
              type: replay.headers.get('content-type'),
              parts: replay.headers.get('x-parts'),
              body: await replay.text(),
            },
            name,
          ).toEqual(expected);
          expect(runs, name).toBe(2);
        },
      );
    }
  });

  it('a client that leaves after the handler returned, while middleware above still works, gets its outcome stored: the retry replays', async () => {
    const log = eventLog();
    let runs = 0;
    let upstreamWaiting!: () => void;
    const waiting = new Promise<void>((resolve) => {
      upstreamWaiting = resolve;
    });
    let clientGone!: () => void;
    const gone = new Promise<void>((resolve) => {
      clientGone = resolve;
    });
    const app = new Koa();
    app.silent = true;
    // Work after next() above the middleware (koa-session saving its session, a log flush).
    app.use(async (ctx, next) => {
      await next();
      if (runs === 1 && ctx.get('x-first') === 'yes') {
        ctx.res.once('close', clientGone);
        upstreamWaiting();
        await gone;
      }
    });
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', lease: '1h', onEvent: log.onEvent }));
    app.use(async (ctx) => {
      runs++;
      ctx.status = 201;
      ctx.body = { run: runs };
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const req = httpRequest(url, {
        method: 'POST',
        headers: { 'idempotency-key': 'late-1', 'x-first': 'yes', 'content-type': 'application/json' },
      });
      req.on('error', () => undefined);
      req.end('{}');
      await waiting;
      req.destroy();
      expect(await log.next(0, 'complete', 'release')).toMatchObject({ type: 'complete' });
      const retry = await post(url, 'late-1');
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.json()).toEqual({ run: 1 });
      expect(runs).toBe(1);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it("a body parser's refusal whose client already left is not stored either: the retry runs", async () => {
    const log = eventLog();
    const leaves = clientLeaves();
    let runs = 0;
    await serve(
      { lease: '1h', onEvent: log.onEvent },
      async (ctx) => {
        runs++;
        if (runs === 1) {
          await leaves.untilGone(ctx);
          // What co-body (raw-body under it) throws for this body of 2 bytes with a limit of 1,
          // after the client hung up.
          throw Object.assign(new Error('request entity too large'), {
            status: 413,
            type: 'entity.too.large',
            expected: 2,
            length: 2,
            limit: 1,
          });
        }
        ctx.body = { run: runs };
      },
      (url) => abandonedThenRuns(url, 'refused-gone-1', leaves.running, log, 'body-refused'),
    );
  });

  it('a body stream that produced nothing when the client left: settled at once, not after a lease (released here by a policy that releases what cannot be replayed)', async () => {
    const log = eventLog();
    const leaves = clientLeaves();
    let runs = 0;
    const all = resolveOutcomePolicy('all');
    await serve(
      // A lease of an hour: only a capture that gives up at once frees the key within the test.
      {
        lease: '1h',
        onEvent: log.onEvent,
        storeOutcome: (outcome) => outcome.unreplayable === undefined && all(outcome),
      },
      async (ctx) => {
        runs++;
        if (runs > 1) {
          ctx.body = { run: runs };
          return;
        }
        // Koa pipes it once the chain returned; it never yields a chunk, so the head never goes out.
        ctx.body = new Readable({ read() {} });
        void leaves.untilGone(ctx);
      },
      // A streamed outcome cannot be known in full once its client left: not stored, and this policy
      // releases the key (the default keeps it, as above).
      (url) => abandonedThenRuns(url, 'silent-1', leaves.running, log, 'streaming'),
    );
  });

  it("a body parser's refusal (co-body's error, or a parser of your own with a body-parser type) is not stored: the fixed retry runs", async () => {
    const refusals: Record<string, (ctx: Koa.Context, text: string) => never> = {
      // What co-body (under @koa/bodyparser and koa-body) throws for a body that is not JSON.
      'co-body': (_ctx, text) => {
        try {
          JSON.parse(text);
        } catch (error) {
          throw Object.assign(error as Error, { status: 400, body: text });
        }
        throw new Error('unreachable');
      },
      'own-parser': (ctx) => ctx.throw(400, 'invalid JSON', { type: 'entity.parse.failed' }),
    };
    for (const [name, refuse] of Object.entries(refusals)) {
      let runs = 0;
      await serve(
        {},
        async (ctx) => {
          const text = (await buffer(ctx.req)).toString('utf8');
          let body: unknown;
          try {
            body = JSON.parse(text);
          } catch {
            refuse(ctx, text);
          }
          runs++;
          ctx.status = 201;
          ctx.body = { got: body };
        },
        async (url) => {
          const send = (body: string) =>
            fetch(url, {
              method: 'POST',
              headers: { 'idempotency-key': `typo-${name}`, 'content-type': 'application/json' },
              body,
            });
          const refused = await send('{"amount":1');
          expect(refused.status, name).toBe(400);
          expect(refused.headers.get('idempotency-key'), name).toBeNull();
          const fixed = await send('{"amount":1}');
          expect(fixed.status, name).toBe(201);
          expect(runs, name).toBe(1);
        },
      );
    }
  });

  it('mounted before the router, the operation is the path as @koa/router matches it by default: /charges, /charges/ and /CHARGES are one', async () => {
    let runs = 0;
    await serve(
      {},
      async (ctx) => {
        // @koa/router's defaults: case-insensitive, the trailing slash optional.
        if (ctx.method !== 'POST' || !/^\/charges\/?$/i.test(ctx.path)) return;
        runs++;
        ctx.status = 201;
        ctx.body = { id: `ch_${runs}` };
      },
      async (url) => {
        expect((await post(`${url}/charges`, 'spelling-1')).status).toBe(201);
        // One key, one operation, one run. The concrete path still tells the requests apart (it is
        // fingerprinted as sent), so a respelled retry is answered 422 rather than replayed.
        for (const path of ['/charges/', '/CHARGES', '/Charges/']) {
          const again = await post(`${url}${path}`, 'spelling-1');
          expect(again.status, path).toBe(422);
        }
        expect(runs).toBe(1);
      },
    );
  });

  it("a 404 no route took is not stored (Koa's own, or after @koa/router matched nothing, even streamed); a 404 a handler set or threw is", async () => {
    let runs = 0;
    const routes: Record<string, (ctx: Koa.Context) => void> = {
      '/charges/ch_1/refunds': (ctx) => {
        ctx.status = 404;
        ctx.body = { error: 'no_such_charge' };
      },
      '/thrown': (ctx) => ctx.throw(404, 'no such thing'),
    };
    await serve(
      {},
      async (ctx, next) => {
        // No router at all: a handler's own 404 without a body is still an answer.
        if (ctx.path === '/plain') {
          runs++;
          ctx.status = 404;
          return;
        }
        if (ctx.path === '/koa-default') return;
        if (ctx.path === '/passes-on') {
          // A route of the app's own that is not for this request: Koa's own 404 follows.
          runs++;
          return next();
        }
        // What @koa/router leaves on the context: it saw the request (ctx.router), and the template
        // of the route it matched, if any (ctx._matchedRoute).
        const state = ctx as Koa.Context & { router?: unknown; _matchedRoute?: string };
        state.router = {};
        const route = routes[ctx.path];
        if (route) {
          runs++;
          state._matchedRoute = ctx.path;
          return route(ctx);
        }
        if (ctx.path === '/routed-passes-on') {
          // A route the router matched passes the request on, and Koa's own 404 follows. Koa leaves
          // the context as a route that did its work and set no body would: stored, the safe side.
          runs++;
          state._matchedRoute = ctx.path;
          return next();
        }
        if (ctx.path === '/streamed-not-found') {
          // A not-found page streamed after the router matched nothing: its head goes out (with the
          // echo) before the end, which still tells that no route took it.
          ctx.status = 404;
          ctx.type = 'text/plain';
          ctx.body = Readable.from(['no such ', 'page']);
          return;
        }
        if (ctx.path === '/get-only') {
          // allowedMethods(): the path has routes, none for this method.
          ctx.status = 405;
          ctx.set('allow', 'GET, HEAD');
          return;
        }
        await next();
        // A not-found page of the app's own.
        ctx.status = 404;
        ctx.body = { error: 'not_found' };
      },
      async (url) => {
        for (const path of ['/koa-default', '/passes-on', '/nothing-here', '/get-only']) {
          const first = await post(`${url}${path}`, `free-${path}`);
          expect(first.headers.get('idempotency-key'), path).toBeNull();
          const again = await post(`${url}${path}`, `free-${path}`);
          expect(again.status, path).toBe(first.status);
          expect(again.headers.get('idempotent-replayed'), path).toBeNull();
        }
        const streamed = await post(`${url}/streamed-not-found`, 'free-streamed');
        expect(streamed.status).toBe(404);
        expect(await streamed.text()).toBe('no such page');
        const retried = await post(`${url}/streamed-not-found`, 'free-streamed');
        expect(retried.headers.get('idempotent-replayed')).toBeNull();
        expect(await retried.text()).toBe('no such page');
        for (const path of ['/plain', '/charges/ch_1/refunds', '/thrown', '/routed-passes-on']) {
          const first = await post(`${url}${path}`, `kept-${path}`);
          expect(first.status, path).toBe(404);
          expect(first.headers.get('idempotency-key'), path).toBe(`kept-${path}`);
          const again = await post(`${url}${path}`, `kept-${path}`);
          expect(again.status, path).toBe(404);
          expect(again.headers.get('idempotent-replayed'), path).toBe('true');
          expect(await again.text(), path).toBe(await first.text());
        }
        expect(runs).toBe(6);
      },
    );
  });
});
