// Operations of apps mounted under a path prefix. koa-mount (the usual way to mount a Koa app or a
// middleware stack at `/v1`) takes its prefix off `ctx.path` while the mounted app runs, and puts
// it back after. The middleware names the operation and fingerprints the request from `ctx.path`,
// so two apps mounted at `/v1` and `/v2` on one store name `POST /v1/charges` and `POST /v2/charges`
// alike (`POST /charges`), with the same fingerprint. Express keeps the mount path (`req.baseUrl`)
// in the operation and Fastify keeps a plugin's prefix in the route template.
import { memoryStore, type Store } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa, { type Middleware } from 'koa';
import { expect, it } from 'vitest';
import { listen } from './support.js';

// What koa-mount 4.2 does with `mount(prefix, middleware)`: for a path under the prefix, the mounted
// middleware runs with `ctx.path` shortened to the rest (`/v1/charges` -> `/charges`, `/v1` -> `/`),
// and the path is put back once it is done. (koa-mount is not a dependency; this is its algorithm.)
function mount(prefix: string, downstream: Middleware): Middleware {
  return async (ctx, upstream) => {
    const previous = ctx.path;
    const rest = previous === prefix ? '/' : previous.startsWith(`${prefix}/`) ? previous.slice(prefix.length) : '';
    if (rest === '') return upstream();
    ctx.path = rest;
    try {
      await downstream(ctx, async () => {
        ctx.path = previous;
        await upstream();
        ctx.path = rest;
      });
    } finally {
      ctx.path = previous;
    }
  };
}

// The adapter on `store` for one tenant, noting the operation of every claim in `operations`.
function recording(store: Store, operations: string[] = []) {
  const idem = idempotency({
    store,
    scope: () => 'tenant-1',
    onEvent: (event) => {
      if (event.type === 'claim') operations.push(event.operation);
    },
  });
  return { idem, operations };
}

// Was wrong: the operation was `POST /charges` under both mounts, and the fingerprint held the same
// path, so the caller's key sent to `/v2/charges` after `/v1/charges` was answered with v1's stored
// response (replayed, 201), and v2's handler never ran: a key replayed a response from another
// endpoint, which docs/concepts.md says it never can. The operation now carries the prefix the mount
// took off, as Express's does with `req.baseUrl`.
it('two apps mounted at /v1 and /v2 on one store keep their operations apart', async () => {
  const store = memoryStore();
  const operations: string[] = [];
  // Each version is its own stack: idempotency, then the handler.
  const version = (name: string): Middleware => {
    const { idem } = recording(store, operations);
    return (ctx) =>
      idem(ctx, async () => {
        ctx.status = 201;
        ctx.body = { version: name };
      });
  };
  const app = new Koa();
  app.use(mount('/v1', version('v1')));
  app.use(mount('/v2', version('v2')));
  await listen(app, async (url) => {
    const post = (path: string) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'mount-1' },
        body: '{"amount":1}',
      });
    const first = await post('/v1/charges');
    expect(first.status).toBe(201);
    expect(await first.json()).toEqual({ version: 'v1' });
    const other = await post('/v2/charges');
    expect(other.headers.get('idempotent-replayed')).toBeNull();
    expect(await other.json()).toEqual({ version: 'v2' });
  });
  expect(operations).toEqual(['POST /v1/charges', 'POST /v2/charges']);
});

// A route matcher as @koa/router leaves its traces on the context (`ctx.router`, `_matchedRoute`,
// the template relative to the router, which knows nothing of the mount). @koa/router is not a
// dependency; glue-edges.test.ts shapes its contexts the same way.
function route(template: string, pattern: RegExp, handler: Middleware): Middleware {
  return (ctx, next) => {
    if (!pattern.test(ctx.path)) return next();
    Object.assign(ctx, { router: {}, _matchedRoute: template });
    return handler(ctx, next);
  };
}

it('names a mounted route by its whole path, with a router inside the mount and at the mount point itself', async () => {
  const { idem, operations } = recording(memoryStore());
  const created: Middleware = (ctx) => {
    ctx.status = 201;
    ctx.body = { ok: true };
  };
  const app = new Koa();
  app.use(
    mount('/v1', async (ctx, next) => {
      await route('/accounts/:id/charges', /^\/accounts\/[^/]+\/charges$/, (c, n) => idem(c, () => created(c, n)))(
        ctx,
        async () => {
          // Not a routed path: the mount point itself, answered without a router.
          if (ctx.path === '/') await idem(ctx, () => created(ctx, next));
          else await next();
        },
      );
    }),
  );
  await listen(app, async (url) => {
    const post = (path: string, key: string) =>
      fetch(`${url}${path}?x=1`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: '{}',
      });
    expect((await post('/v1/accounts/7/charges', 'k-1')).status).toBe(201);
    expect((await post('/v1', 'k-2')).status).toBe(201);
    expect((await post('/v1/', 'k-3')).status).toBe(201);
    // Outside the mount: the path as it is.
    expect((await post('/v2', 'k-4')).status).toBe(404);
  });
  expect(operations).toEqual(['POST /v1/accounts/:id/charges', 'POST /v1', 'POST /v1']);
});

it('finds the mount prefix of a request target in absolute form', async () => {
  const { idem, operations } = recording(memoryStore());
  const app = new Koa();
  app.use(
    mount('/v1', (ctx, next) =>
      idem(ctx, async () => {
        ctx.status = 201;
        ctx.body = { ok: true };
        await next();
      }),
    ),
  );
  await listen(app, async (url) => {
    const { request } = await import('node:http');
    const { port } = new URL(url);
    const status = await new Promise<number>((resolve, reject) => {
      const req = request({
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: `http://127.0.0.1:${port}/v1/charges?x=1`,
        headers: { 'content-type': 'application/json', 'idempotency-key': 'abs-1' },
      });
      req.on('response', (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.end('{}');
    });
    expect(status).toBe(201);
  });
  expect(operations).toEqual(['POST /v1/charges']);
});

// koa-mount with a prefix that ends in a slash (`mount('/v1/', app)`) runs the app with `ctx.path`
// `charges` for `/v1/charges`: no leading slash. The prefix was not found, and the operation was
// named `POST charges` under every such mount.
it('finds the prefix of a mount whose prefix ends in a slash', async () => {
  const { idem, operations } = recording(memoryStore());
  // What koa-mount does for `mount('/v1/', ...)`: the prefix replaced, the slash with it.
  const trailing =
    (prefix: string, downstream: Middleware): Middleware =>
    async (ctx, upstream) => {
      const previous = ctx.path;
      if (!previous.startsWith(prefix)) return upstream();
      ctx.path = previous.slice(prefix.length) || '/';
      try {
        await downstream(ctx, upstream);
      } finally {
        ctx.path = previous;
      }
    };
  const created: Middleware = (ctx) => {
    ctx.status = 201;
    ctx.body = { ok: true };
  };
  const app = new Koa();
  app.use(trailing('/v1/', (ctx, next) => idem(ctx, () => created(ctx, next))));
  app.use(trailing('/v2/', (ctx, next) => idem(ctx, () => created(ctx, next))));
  await listen(app, async (url) => {
    const post = (path: string) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'trailing-1' },
        body: '{}',
      });
    expect((await post('/v1/charges')).status).toBe(201);
    const other = await post('/v2/charges');
    expect(other.headers.get('idempotent-replayed')).toBeNull();
  });
  expect(operations).toEqual(['POST /v1/charges', 'POST /v2/charges']);
});
