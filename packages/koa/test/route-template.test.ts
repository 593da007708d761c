// routeTemplateOf (packages/koa/src/idempotency.ts) against what @koa/router 15.7 leaves on
// the context. `ctx.matched` lists every layer whose path matches, whatever its method (the route
// that runs, and routes after it that only run if it calls next()), while `ctx._matchedRoute` names
// the layer that is running. Checked with the real router: `router.post('/charges/:id', idem, h)`
// then `router.all('{/*rest}', notFound)`; at idem, `_matchedRoute` is '/charges/:id' and
// `matched` is ['/charges/:id' (POST), '{/*rest}' (every method)].
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { listen } from './support.js';

const everyMethod = ['HEAD', 'DELETE', 'GET', 'OPTIONS', 'PATCH', 'POST', 'PUT'];

// Was a defect: mounted on a route (`router.post('/charges/:id', idempotency(...), handler)`) of a router
// that ends with a catch-all (`router.all('{/*rest}', ...)`, a custom 404), the operation is
// `POST {/*rest}`: routeTemplateOf takes the LAST layer of `ctx.matched` of this method, the
// catch-all that never runs, before `_matchedRoute` (which the code before this change used, and
// which named the route); every route of the router then shares one operation, so a storeOutcome or
// metrics keyed by operation never match and one key reused on two routes is 422. Same under
// router.use(): the last, not the first, route layer after the use layer is picked.
// Expected: `POST /charges/:id`, the route that runs (prefer `_matchedRoute` when it names a route
// layer; under a use layer, take the first route layer of the method, not the last).
it('mounted on a route of a router that ends with a catch-all, the operation is that route', async () => {
  const operations: string[] = [];
  const guarded = idempotency({
    store: memoryStore(),
    scope: () => 'tenant-1',
    onEvent: (event) => operations.push(event.operation),
  });
  const app = new Koa();
  app.use(async (ctx, next) => {
    if (!ctx.path.startsWith('/charges/')) return next();
    // What @koa/router 15.7 leaves on the context while the route layer '/charges/:id' runs.
    Object.assign(ctx, {
      router: {},
      _matchedRoute: '/charges/:id',
      matched: [
        { path: '/charges/:id', methods: ['POST'] },
        { path: '{/*rest}', methods: everyMethod },
      ],
    });
    await guarded(ctx, async () => {
      ctx.status = 201;
      ctx.body = { ok: true };
    });
  });
  await listen(app, async (url) => {
    const answer = await fetch(`${url}/charges/1`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'catch-all-1' },
      body: '{}',
    });
    expect(answer.status).toBe(201);
  });
  expect(operations).toContain('POST /charges/:id');
  expect(operations.filter((operation) => operation.includes('rest'))).toEqual([]);
});
