import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { memoryStore } from '@idem/core';
import {
  createGuard,
  createInternalTokenIssuer,
  defaultInternalTokenHeader,
  type Principal,
  policy,
  principalFromClaims,
} from '@idem/guard';
import { idempotency, type KoaIdempotencyOptions } from '@idem/koa';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, guard, internalAuth } from '../src/auth.js';
import { abandonedPost, clientLeaves, eventLog, listen } from './support.js';

async function serve(
  options: Partial<KoaIdempotencyOptions>,
  handler: Koa.Middleware,
  run: (url: string) => Promise<void>,
  before?: Koa.Middleware,
) {
  const app = new Koa();
  if (before) app.use(before);
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', ...options }));
  app.use(handler);
  await listen(app, run);
}

const post = (url: string, key: string | undefined, body = '{}') =>
  fetch(url, {
    method: 'POST',
    headers: { ...(key === undefined ? {} : { 'idempotency-key': key }), 'content-type': 'application/json' },
    body,
  });

describe('@idem/koa idempotency, beyond the scenario table', () => {
  it('with required: false, a request that sends a key is still made idempotent; one without a key runs each time', async () => {
    let runs = 0;
    await serve(
      { required: false },
      async (ctx) => {
        ctx.status = 201;
        ctx.body = { run: ++runs };
      },
      async (url) => {
        expect((await post(`${url}/charges`, 'optional-1')).status).toBe(201);
        const retry = await post(`${url}/charges`, 'optional-1');
        expect(retry.headers.get('idempotent-replayed')).toBe('true');
        expect(await retry.json()).toEqual({ run: 1 });
        expect((await post(`${url}/charges`, undefined)).status).toBe(201);
        expect((await post(`${url}/charges`, undefined)).status).toBe(201);
        expect(runs).toBe(3);
      },
    );
  });

  it('mounted after a body parser: fingerprints the parsed ctx.request.body, so replays and mismatches still work', async () => {
    let runs = 0;
    // A body parser as @koa/bodyparser is one: it reads ctx.req and leaves the value on ctx.request.body.
    const parser: Koa.Middleware = async (ctx, next) => {
      (ctx.request as { body?: unknown }).body = JSON.parse((await buffer(ctx.req)).toString('utf8'));
      await next();
    };
    await serve(
      {},
      async (ctx) => {
        ctx.body = { got: (ctx.request as { body?: unknown }).body, run: ++runs };
      },
      async (url) => {
        expect(await (await post(`${url}/charges`, 'parsed-1', '{"amount":1}')).json()).toEqual({
          got: { amount: 1 },
          run: 1,
        });
        const again = await post(`${url}/charges`, 'parsed-1', '{ "amount": 1 }');
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expect((await post(`${url}/charges`, 'parsed-1', '{"amount":2}')).status).toBe(422);
        expect(runs).toBe(1);
      },
      parser,
    );
  });

  it('mounted on a route of @koa/router, the operation is the route template: one key spans /charges/:id only with the same path', async () => {
    let runs = 0;
    const app = new Koa();
    const guarded = idempotency({ store: memoryStore(), scope: () => 'tenant-1' });
    // What @koa/router leaves on the context before a route's middleware: the matched template.
    app.use(async (ctx, next) => {
      const match = /^\/charges\/([^/]+)$/.exec(ctx.path);
      if (!match) return next();
      Object.assign(ctx, { router: {}, _matchedRoute: '/charges/:id', params: { id: match[1] } });
      await guarded(ctx, async () => {
        ctx.status = 201;
        ctx.body = { run: ++runs };
      });
    });
    await listen(app, async (url) => {
      expect((await post(`${url}/charges/1`, 'template-1')).status).toBe(201);
      // The same operation (POST /charges/:id), another concrete path: another request.
      expect((await post(`${url}/charges/2`, 'template-1')).status).toBe(422);
      expect((await post(`${url}/charges/1`, 'template-1')).headers.get('idempotent-replayed')).toBe('true');
      expect(runs).toBe(1);
    });
  });

  // Was a defect: mounted with `router.use()` (on a router with a prefix, say), the operation was the
  // use layer @koa/router names in `_matchedRoute` (`/v1(?:\/|$)`), one for every route under it,
  // so a `storeOutcome` keyed by operation never matched; the route layers in `ctx.matched` name the
  // route that runs.
  it('mounted with router.use(), the operation is the template of the route that runs, not the use layer', async () => {
    const operations: string[] = [];
    const app = new Koa();
    const guarded = idempotency({
      store: memoryStore(),
      scope: () => 'tenant-1',
      onEvent: (event) => operations.push(event.operation),
    });
    // What @koa/router 15 leaves on the context when it runs a use layer of a router prefixed /v1.
    app.use(async (ctx, next) => {
      if (!ctx.path.startsWith('/v1/')) return next();
      Object.assign(ctx, {
        router: {},
        _matchedRoute: '/v1(?:\\/|$)',
        matched: [
          { path: '/v1(?:\\/|$)', methods: [] },
          { path: '/v1/charges/:id', methods: ['POST'] },
          { path: '/v1/charges/:id', methods: ['HEAD', 'GET'] },
        ],
      });
      await guarded(ctx, async () => {
        ctx.status = 201;
        ctx.body = { ok: true };
      });
    });
    await listen(app, async (url) => {
      expect((await post(`${url}/v1/charges/1`, 'use-layer-1')).status).toBe(201);
    });
    expect(operations).toContain('POST /v1/charges/:id');
    expect(operations.filter((operation) => operation.includes('(?:'))).toEqual([]);
  });

  it("a 501 from @koa/router's allowedMethods() answered for no route: not stored, the key released", async () => {
    let runs = 0;
    await serve(
      {},
      async (ctx) => {
        runs++;
        (ctx as Koa.Context & { router?: unknown }).router = {};
        ctx.status = 501;
      },
      async (url) => {
        const first = await post(`${url}/custom-method`, 'not-implemented');
        expect(first.status).toBe(501);
        expect(first.headers.get('idempotency-key')).toBeNull();
        const again = await post(`${url}/custom-method`, 'not-implemented');
        expect(again.status).toBe(501);
        expect(again.headers.get('idempotent-replayed')).toBeNull();
        expect(runs).toBe(2);
      },
    );
  });

  it('a 404 a handler writes itself (ctx.respond = false) is its answer, not a request no route took: stored', async () => {
    let runs = 0;
    await serve(
      {},
      async (ctx) => {
        runs++;
        ctx.respond = false;
        ctx.res.writeHead(404, { 'content-type': 'text/plain' });
        ctx.res.end('no such charge');
      },
      async (url) => {
        const first = await post(`${url}/charges/ch_1`, 'by-hand');
        expect(first.status).toBe(404);
        expect(await first.text()).toBe('no such charge');
        const again = await post(`${url}/charges/ch_1`, 'by-hand');
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expect(await again.text()).toBe('no such charge');
        expect(runs).toBe(1);
      },
    );
  });

  it('a scope function that throws is a 500, never a hung request nor the handler', async () => {
    let runs = 0;
    await serve(
      {
        scope: () => {
          throw new Error('tenant lookup failed');
        },
      },
      async (ctx) => {
        runs++;
        ctx.body = { ok: true };
      },
      async (url) => {
        expect((await post(`${url}/charges`, 'scope-throws')).status).toBe(500);
        expect(runs).toBe(0);
      },
    );
  });

  it('client gone, a handler that then throws a 4xx: its status and message are stored as Koa would have sent them', async () => {
    const log = eventLog();
    let runs = 0;
    const leaving = clientLeaves();
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        runs++;
        if (runs === 1) await leaving.untilGone(ctx);
        ctx.throw(409, 'conflict');
      },
      async (url) => {
        await abandonedPost(url, 'gone-thrown', leaving.running);
        expect((await log.next(0, 'complete', 'release')).type).toBe('complete');
        const replay = await post(url, 'gone-thrown');
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(replay.status).toBe(409);
        // Was wrong: 'Conflict', the status's text; Koa sends an exposed error's message (a 4xx of
        // ctx.throw is exposed) to a client that stays.
        expect(await replay.text()).toBe('conflict');
        expect(runs).toBe(1);
      },
    );
  });

  it('client gone, a handler that took the response over and then throws: the error is stored, not left in progress', async () => {
    const log = eventLog();
    let runs = 0;
    const leaving = clientLeaves();
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        runs++;
        ctx.respond = false;
        if (runs === 1) await leaving.untilGone(ctx);
        throw new Error('failed after the client left');
      },
      async (url) => {
        await abandonedPost(url, 'gone-raw-thrown', leaving.running);
        expect((await log.next(0, 'complete', 'release')).type).toBe('complete');
        const replay = await post(url, 'gone-raw-thrown');
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(replay.status).toBe(500);
        expect(runs).toBe(1);
      },
    );
  });

  it('client gone, a web stream body nobody will read: its source is told to stop', async () => {
    const log = eventLog();
    const leaving = clientLeaves();
    let cancelled = false;
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        await leaving.untilGone(ctx);
        ctx.body = new ReadableStream({
          pull(controller) {
            controller.enqueue(new TextEncoder().encode('more'));
          },
          cancel() {
            cancelled = true;
          },
        });
      },
      async (url) => {
        await abandonedPost(url, 'gone-web', leaving.running);
        // Settled at once: the operation ran, so the key is kept (its body cannot be replayed).
        expect(await log.next(0, 'complete', 'release')).toMatchObject({ type: 'complete', status: 500 });
        expect(cancelled).toBe(true);
      },
    );
  });

  it('client gone, a Node stream body nobody will read: it is destroyed, and the outcome settled at once', async () => {
    const log = eventLog();
    const leaving = clientLeaves();
    const body = new Readable({
      read() {
        this.push('more');
      },
    });
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        await leaving.untilGone(ctx);
        ctx.body = body;
      },
      async (url) => {
        await abandonedPost(url, 'gone-node-stream', leaving.running);
        expect(await log.next(0, 'complete', 'release')).toMatchObject({ type: 'complete', status: 500 });
        expect(body.destroyed).toBe(true);
      },
    );
  });

  it('client gone, a handler that took the response over and writes it after returning: what it writes is stored', async () => {
    const log = eventLog();
    let runs = 0;
    const leaving = clientLeaves();
    await serve(
      { onEvent: log.onEvent },
      async (ctx) => {
        runs++;
        ctx.respond = false;
        if (runs === 1) {
          await leaving.untilGone(ctx);
          // Written later, from outside the middleware chain.
          setImmediate(() => {
            ctx.res.writeHead(201, { 'content-type': 'text/plain' });
            ctx.res.end('written late');
          });
          return;
        }
        ctx.res.writeHead(201, { 'content-type': 'text/plain' });
        ctx.res.end('written late');
      },
      async (url) => {
        await abandonedPost(url, 'gone-late', leaving.running);
        expect((await log.next(0, 'complete', 'release')).type).toBe('complete');
        const replay = await post(url, 'gone-late');
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(replay.status).toBe(201);
        expect(await replay.text()).toBe('written late');
        expect(runs).toBe(1);
      },
    );
  });
});

describe('@idem/koa guard glue, beyond the scenario table', () => {
  const clock = manualClock();
  const edge = () => createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
  const bearer = (claims: Record<string, unknown> = {}) => ({ authorization: `Bearer ${makeToken({ claims })}` });

  // What koa-mount does: the mounted app sees the path without its prefix (ctx.originalUrl keeps it).
  const mount =
    (prefix: string, inner: Koa.Middleware): Koa.Middleware =>
    async (ctx, next) => {
      if (!ctx.path.startsWith(`${prefix}/`)) return next();
      const original = ctx.path;
      ctx.path = ctx.path.slice(prefix.length);
      try {
        await inner(ctx, next);
      } finally {
        ctx.path = original;
      }
    };

  it('authorize() under a mounted app: a policy sees the URL as the client sent it, mount prefix included', async () => {
    const app = new Koa();
    const verify = guard(edge());
    const allow = authorize(policy((_principal, request) => request.url?.startsWith('/api/tenants/t1/') === true));
    let runs = 0;
    app.use(
      mount('/api', async (ctx) => {
        await verify(ctx, () =>
          allow(ctx, async () => {
            runs++;
            ctx.body = { ok: true };
          }),
        );
      }),
    );
    await listen(app, async (url) => {
      expect((await fetch(`${url}/api/tenants/t1/orders`, { headers: bearer() })).status).toBe(200);
      expect((await fetch(`${url}/api/tenants/t2/orders`, { headers: bearer() })).status).toBe(403);
      expect(runs).toBe(1);
    });
  });

  it('authorize() hands the route parameters to policies: one tenant reaches only its own orders', async () => {
    const app = new Koa();
    const verify = guard(edge());
    const allow = authorize(
      policy((principal, request) => (request.params as { tenant?: string }).tenant === principal.claims.tenant),
    );
    let runs = 0;
    app.use(async (ctx) => {
      const match = /^\/tenants\/([^/]+)\/orders$/.exec(ctx.path);
      if (!match) return;
      Object.assign(ctx, { params: { tenant: match[1] } });
      await verify(ctx, () =>
        allow(ctx, async () => {
          runs++;
          ctx.body = { ok: true };
        }),
      );
    });
    await listen(app, async (url) => {
      expect((await fetch(`${url}/tenants/t1/orders`, { headers: bearer({ tenant: 't1' }) })).status).toBe(200);
      expect((await fetch(`${url}/tenants/t2/orders`, { headers: bearer({ tenant: 't1' }) })).status).toBe(403);
      expect(runs).toBe(1);
    });
  });

  it('authorize() after something other than guard() set ctx.state.auth: 401 problem, never a 500 nor the handler', async () => {
    const app = new Koa();
    let runs = 0;
    app.use(async (ctx, next) => {
      ctx.state.auth = principalFromClaims({ sub: 'forged', iss: 'nobody' }) satisfies Principal;
      await next();
    });
    app.use(authorize());
    app.use(async (ctx) => {
      runs++;
      ctx.body = { ok: true };
    });
    await listen(app, async (url) => {
      const answer = await fetch(`${url}/orders`);
      expect(answer.status).toBe(401);
      expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(runs).toBe(0);
    });
  });

  it('guard() and authorize() wait for what follows: a handler that answers after an await is what the client gets', async () => {
    const app = new Koa();
    app.use(guard(edge()));
    app.use(authorize());
    app.use(async (ctx) => {
      await new Promise((resolve) => setImmediate(resolve));
      ctx.status = 201;
      ctx.body = { late: true };
    });
    await listen(app, async (url) => {
      const answer = await fetch(`${url}/orders`, { method: 'POST', headers: bearer() });
      expect(answer.status).toBe(201);
      expect(await answer.json()).toEqual({ late: true });
    });
  });

  it('internalAuth() built from options (not a Guard) verifies the internal token and sets ctx.state.auth', async () => {
    const issuer = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const app = new Koa();
    app.use(
      internalAuth({ issuer: 'https://gateway.example', audience: 'orders', jwks: issuer.jwks(), now: clock.now }),
    );
    app.use(async (ctx) => {
      ctx.body = { sub: (ctx.state.auth as Principal).sub };
    });
    const token = await issuer.mint(principalFromClaims({ sub: 'user-1', iss: ISSUER }, { issuer: ISSUER }), {
      audience: 'orders',
    });
    await listen(app, async (url) => {
      const answer = await fetch(`${url}/internal`, { headers: { [defaultInternalTokenHeader]: token } });
      expect(answer.status).toBe(200);
      expect(await answer.json()).toEqual({ sub: 'user-1' });
      expect((await fetch(`${url}/internal`, { headers: bearer() })).status).toBe(401);
    });
  });
});
