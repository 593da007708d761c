// The Koa server of the describeAdapter table, shared by the memory and the real-store runs.
import { createReadStream } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { idempotency } from '@idem/koa';
import type { AdapterServerOptions, ScenarioReply } from '@idem/testkit';
import Koa, { type Context, type Middleware, type Next } from 'koa';

export async function makeKoaServer({
  idempotency: options,
  routes,
  routeIdempotency = {},
  stacked,
  handle,
}: AdapterServerOptions) {
  let runs = 0;
  const app = new Koa();
  // Thrown handler errors are part of the table; keep them out of the test output.
  app.silent = true;
  // The guard's job in production: a verified principal on ctx.state.auth.
  app.use(async (ctx, next) => {
    const user = ctx.get('x-test-user');
    if (user) (ctx.state as { auth?: unknown }).auth = { sub: user, iss: 'https://issuer.test' };
    await next();
  });
  // The route a request is for; a GET route answers HEAD too, as @koa/router's does.
  const routeOf = (ctx: Context) =>
    routes.find(
      (candidate) =>
        (candidate.method === ctx.method || (candidate.method === 'GET' && ctx.method === 'HEAD')) &&
        (candidate.path === ctx.path || (candidate.path === '/charges/:id' && /^\/charges\/[^/]+$/.test(ctx.path))),
    );
  // A body parser mounted after the middleware, reading ctx.req as @koa/bodyparser does. A multipart
  // body is left as its bytes: the stand-in for a multipart parser.
  const parse = async (ctx: Context, next: Next) => {
    const chunks: Buffer[] = [];
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
    const bytes = Buffer.concat(chunks);
    const text = bytes.toString('utf8');
    const type = ctx.get('content-type');
    const request = ctx.request as { body?: unknown };
    if (type.startsWith('application/json') && text) request.body = parseJson(text);
    else if (type.startsWith('application/x-www-form-urlencoded'))
      request.body = Object.fromEntries(new URLSearchParams(text));
    else if (type.startsWith('multipart/form-data')) request.body = bytes;
    await next();
  };
  const dispatch = async (ctx: Context) => {
    const route = routeOf(ctx);
    // No route: Koa's own 404, as an app without one answers.
    if (!route) return;
    runs++;
    const reply = await handle({
      method: route.method,
      route: route.path,
      body: (ctx.request as { body?: unknown }).body,
      tx: ctx.state.idempotency?.tx,
      signal: ctx.state.idempotency?.signal,
      context: ctx.state.idempotency,
    });
    write(ctx, reply);
  };
  // Routes with an instance of their own run it, then the parser and the handler, as @koa/router
  // runs route middleware; the shared instance never sees them.
  const own = new Map<string, Middleware>();
  for (const [path, routeOptions] of Object.entries(routeIdempotency)) {
    if (routeOptions) own.set(path, idempotency(routeOptions));
  }
  if (own.size > 0) {
    app.use(async (ctx, next) => {
      const route = routeOf(ctx);
      const instance = route && own.get(route.path);
      if (!instance) return next();
      await instance(ctx, () => parse(ctx, () => dispatch(ctx)));
    });
  }
  app.use(idempotency(options));
  // A second instance behind the shared one, when a scenario stacks one.
  if (stacked !== undefined) app.use(idempotency(stacked));
  app.use(parse);
  app.use(dispatch);
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    executions: () => runs,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// JSON.parse, refusing a body that is not JSON as co-body (under @koa/bodyparser and koa-body) does:
// its error, with status 400 and the text in `body`.
function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw Object.assign(error as Error, { status: 400, body: text });
  }
}

function write(ctx: Context, reply: ScenarioReply) {
  if (reply.kind === 'throw') throw reply.error ?? new Error('handler failed');
  if (reply.kind === 'destroy') {
    ctx.respond = false;
    ctx.res.destroy();
    return;
  }
  ctx.status = reply.status;
  ctx.set(reply.headers);
  switch (reply.kind) {
    case 'late-header':
      ctx.respond = false;
      ctx.res.write(reply.chunks[0]);
      // Koa skips a header once the head went out (ctx.headerSent).
      ctx.set(reply.late);
      ctx.res.end(reply.chunks[1]);
      return;
    case 'json':
      ctx.body = reply.json;
      if (reply.statusMessage !== undefined) ctx.message = reply.statusMessage;
      return;
    case 'text':
      ctx.body = reply.text;
      return;
    case 'bytes':
      ctx.body = reply.bytes;
      return;
    case 'stream':
    case 'broken':
      ctx.body = reply.stream();
      return;
    case 'file':
      ctx.body = createReadStream(reply.file);
      return;
    case 'events': {
      const feed = new PassThrough();
      ctx.body = feed;
      for (const event of reply.events) feed.write(event);
      feed.end();
      return;
    }
    case 'none':
      ctx.body = null;
      ctx.status = reply.status;
      return;
  }
}
