import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { type Principal, requireRoles, requireScopes } from '@idem/guard';
import Koa, { type Context, type Middleware } from 'koa';
import { describeAuthGlue } from '../../guard/test/support/http-scenarios.js';
import { authorize, forwardHeaders, guard, internalAuth } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

// A tiny exact-path router, so the test depends on nothing but Koa itself.
function route(method: string | undefined, path: string, ...stack: Middleware[]): Middleware {
  const composed = stack.reduceRight<(ctx: Context) => Promise<void>>(
    (next, middleware) => async (ctx) => {
      await middleware(ctx, () => next(ctx));
    },
    async () => {},
  );
  return async (ctx, next) => {
    if (ctx.path === path && (method === undefined || ctx.method === method)) await composed(ctx);
    else await next();
  };
}

describeAuthGlue('Koa', async ({ guard: edge, shopGuard, dpopGuard, nonceGuard, verifier, hit }) => {
  const app = new Koa();
  const verify = guard(edge);
  const internal = internalAuth(verifier);
  const principal = (ctx: Context) => ctx.state.auth as Principal;
  app.use(
    route(undefined, '/protected', verify, async (ctx) => {
      hit('protected');
      ctx.body = { sub: principal(ctx).sub, scope: [...principal(ctx).scope] };
    }),
  );
  app.use(
    route('GET', '/write', verify, authorize(requireScopes('orders:write')), async (ctx) => {
      hit('write');
      ctx.body = { ok: true };
    }),
  );
  app.use(
    route('GET', '/admin', verify, authorize(requireRoles('admin')), async (ctx) => {
      hit('admin');
      ctx.body = { ok: true };
    }),
  );
  app.use(
    route('GET', '/forward', verify, async (ctx) => {
      hit('forward');
      ctx.body = await forwardHeaders(ctx, { audience: 'orders' });
    }),
  );
  app.use(
    route('GET', '/internal', internal, async (ctx) => {
      hit('internal');
      ctx.body = { sub: principal(ctx).sub, iss: principal(ctx).iss, scope: [...principal(ctx).scope] };
    }),
  );
  app.use(
    route('GET', '/internal-write', internal, authorize(requireScopes('orders:write')), async (ctx) => {
      hit('internal-write');
      ctx.body = { ok: true };
    }),
  );
  app.use(
    route('GET', '/authorize-only', authorize(requireScopes('orders:read')), async (ctx) => {
      hit('authorize-only');
      ctx.body = { ok: true };
    }),
  );
  app.use(
    route(undefined, '/dpop', guard(dpopGuard), async (ctx) => {
      hit('dpop');
      ctx.body = { sub: principal(ctx).sub };
    }),
  );
  const optional = guard(shopGuard, { optional: true });
  const subOf = (ctx: Context) => (ctx.state.auth as Principal | undefined)?.sub ?? null;
  app.use(
    route(undefined, '/optional', optional, async (ctx) => {
      hit('optional');
      ctx.body = { sub: subOf(ctx) };
    }),
  );
  app.use(
    route('GET', '/optional-read', optional, authorize(requireScopes('orders:read')), async (ctx) => {
      hit('optional-read');
      ctx.body = { ok: true };
    }),
  );
  let charges = 0;
  app.use(
    route('POST', '/optional-charge', optional, idempotency({ store: memoryStore() }), async (ctx) => {
      hit('optional-charge');
      ctx.status = 201;
      ctx.body = { sub: subOf(ctx), n: ++charges };
    }),
  );
  const everyone = idempotency({ store: memoryStore(), scope: () => 'everyone' });
  app.use(
    route('POST', '/optional-scoped-charge', optional, everyone, async (ctx) => {
      hit('optional-scoped-charge');
      ctx.status = 201;
      ctx.body = { sub: subOf(ctx) ?? null, n: ++charges };
    }),
  );
  app.use(
    route(undefined, '/dpop-nonce', guard(nonceGuard), async (ctx) => {
      hit('dpop-nonce');
      ctx.body = { sub: principal(ctx).sub };
    }),
  );
  app.use(
    route(undefined, '/optional-dpop', guard(dpopGuard, { optional: true }), async (ctx) => {
      hit('optional-dpop');
      ctx.body = { sub: subOf(ctx) };
    }),
  );
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
});
