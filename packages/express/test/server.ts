// The Express server of the describeAdapter table, shared by the memory and the real-store runs.
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream';
import { idempotency, idempotencyErrors } from '@idem/express';
import type { AdapterServerOptions, ScenarioReply, ScenarioRoute } from '@idem/testkit';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';

/** Express itself: version 5 by default, or another release with the same API (Express 4). */
export type ExpressFactory = typeof express;

export async function makeExpressServer(
  { idempotency: options, routes, routeIdempotency = {}, stacked, handle }: AdapterServerOptions,
  createApp: ExpressFactory = express,
) {
  let runs = 0;
  const app = createApp();
  // The guard's job in production: a verified principal on req.auth, never a client header as such.
  app.use((req, _res, next) => {
    const user = req.get('x-test-user');
    if (user) (req as { auth?: unknown }).auth = { sub: user, iss: 'https://issuer.test' };
    next();
  });
  // A multipart body is left as its bytes: the stand-in for a multipart parser (multer, busboy).
  const parsers = [
    createApp.json(),
    createApp.urlencoded({ extended: false }),
    createApp.raw({ type: 'multipart/form-data' }),
  ];
  const mount = (route: ScenarioRoute, ...before: RequestHandler[]) => {
    const method = route.method.toLowerCase() as 'post' | 'patch' | 'get' | 'options';
    // Errors go to next() by hand: Express 4 does not catch a rejected promise (5 does).
    app[method](route.path, ...before, (req: Request, res: Response, next: NextFunction) => {
      runs++;
      handle({
        method: route.method,
        route: route.path,
        body: req.body,
        tx: req.idempotency?.tx,
        signal: req.idempotency?.signal,
        context: req.idempotency,
      })
        .then((reply) => write(res, reply))
        .catch(next);
    });
  };
  // Routes with an instance of their own have it on the route, ahead of the shared middleware: they
  // answer, so the shared one never sees their requests.
  const own = new Map<string, RequestHandler>();
  for (const [path, routeOptions] of Object.entries(routeIdempotency)) {
    if (routeOptions) own.set(path, idempotency(routeOptions));
  }
  for (const route of routes) {
    const instance = own.get(route.path);
    if (instance) mount(route, instance, ...parsers);
  }
  // Mounted before the body parsers, which still see the body it read.
  app.use(idempotency(options));
  app.use(...parsers);
  // A second instance on each route, behind the app-wide one (and its parsers), when a scenario stacks one.
  const second = stacked === undefined ? [] : [idempotency(stacked)];
  for (const route of routes) if (!own.has(route.path)) mount(route, ...second);
  // First among the error handlers (Express's own is the only other): tells the policy a handler threw.
  app.use(idempotencyErrors());
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

function write(res: Response, reply: ScenarioReply) {
  if (reply.kind === 'throw') throw reply.error ?? new Error('handler failed');
  if (reply.kind === 'destroy') {
    res.destroy();
    return;
  }
  res.status(reply.status).set(reply.headers);
  switch (reply.kind) {
    case 'late-header':
      res.write(reply.chunks[0]);
      try {
        res.set(reply.late);
      } catch {
        // ERR_HTTP_HEADERS_SENT: the head went out with the first chunk.
      }
      res.end(reply.chunks[1]);
      return;
    case 'json':
      if (reply.statusMessage !== undefined) res.statusMessage = reply.statusMessage;
      res.json(reply.json);
      return;
    case 'text':
      res.send(reply.text);
      return;
    case 'bytes':
      res.write(reply.bytes.subarray(0, 10));
      res.end(reply.bytes.subarray(10));
      return;
    case 'stream':
      reply.stream().pipe(res);
      return;
    case 'broken':
      pipeline(reply.stream(), res, ignore);
      return;
    case 'file':
      res.sendFile(reply.file);
      return;
    case 'events':
      res.flushHeaders();
      for (const event of reply.events) res.write(event);
      res.end();
      return;
    case 'none':
      res.end();
      return;
  }
}

function ignore() {
  // The pipeline's failure is the scenario: it destroyed the response.
}
