// The Fastify server of the describeAdapter table, shared by the memory and the real-store runs.
import { createReadStream } from 'node:fs';
import { pipeline } from 'node:stream';
import { type FastifyIdempotencyOptions, idempotency } from '@idem/fastify';
import type { AdapterServerOptions, ScenarioReply, ScenarioRoute } from '@idem/testkit';
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';

export async function makeFastifyServer({
  idempotency: options,
  routes,
  routeIdempotency = {},
  stacked,
  handle,
}: AdapterServerOptions) {
  let runs = 0;
  const app = Fastify();
  // The guard's job in production: a verified principal on request.auth.
  app.addHook('onRequest', async (request) => {
    const user = request.headers['x-test-user'];
    if (typeof user === 'string') (request as { auth?: unknown }).auth = { sub: user, iss: 'https://issuer.test' };
  });
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_request, body, done) => {
    done(null, Object.fromEntries(new URLSearchParams(String(body))));
  });
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer' }, (_request, body, done) =>
    done(null, body),
  );
  // A multipart body is left as its bytes: the stand-in for @fastify/multipart.
  app.addContentTypeParser('multipart/form-data', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));
  const mount = (instance: FastifyInstance, route: ScenarioRoute) =>
    instance.route({
      method: route.method,
      url: route.path,
      handler: async (request, reply) => {
        runs++;
        const answer = await handle({
          method: route.method,
          route: route.path,
          body: request.body,
          tx: request.idempotency?.tx,
          signal: request.idempotency?.signal,
          context: request.idempotency,
        });
        return write(reply, answer);
      },
    });
  // Routes with an instance of their own: each instance, the shared one too, in an encapsulated
  // context holding only its routes. (The plugin is wrapped with fastify-plugin: registered on the
  // root it would run for the routes of every context, the others' included, and claim their keys
  // a second time.) Without such routes the shared instance is registered on the root, as usual.
  const own = Object.entries(routeIdempotency).filter(
    (entry): entry is [string, FastifyIdempotencyOptions] => entry[1] !== undefined,
  );
  if (stacked !== undefined) {
    // A second instance behind the root one: registered in the context that holds the routes.
    await app.register(idempotency, options);
    await app.register(async (instance) => {
      await instance.register(idempotency, stacked);
      for (const route of routes) mount(instance, route);
    });
  } else if (own.length === 0) {
    await app.register(idempotency, options);
    for (const route of routes) mount(app, route);
  } else {
    const ownPaths = new Set(own.map(([path]) => path));
    const contexts = [
      ...own.map(([path, instanceOptions]) => ({ instanceOptions, routes: routes.filter((r) => r.path === path) })),
      { instanceOptions: options, routes: routes.filter((route) => !ownPaths.has(route.path)) },
    ];
    for (const context of contexts) {
      await app.register(async (instance) => {
        await instance.register(idempotency, context.instanceOptions);
        for (const route of context.routes) mount(instance, route);
      });
    }
  }
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, executions: () => runs, close: () => app.close() };
}

function write(reply: FastifyReply, answer: ScenarioReply) {
  if (answer.kind === 'throw') throw answer.error ?? new Error('handler failed');
  if (answer.kind === 'destroy') {
    reply.hijack();
    reply.raw.destroy();
    return reply;
  }
  reply.code(answer.status).headers(answer.headers);
  switch (answer.kind) {
    case 'late-header': {
      reply.hijack();
      reply.raw.writeHead(answer.status, answer.headers);
      reply.raw.write(answer.chunks[0]);
      try {
        for (const [name, value] of Object.entries(answer.late)) reply.raw.setHeader(name, value);
      } catch {
        // ERR_HTTP_HEADERS_SENT: the head went out with the first chunk.
      }
      reply.raw.end(answer.chunks[1]);
      return reply;
    }
    case 'json':
      // Fastify has no API for a reason phrase: Node's, on the raw response, which Fastify writes.
      if (answer.statusMessage !== undefined) reply.raw.statusMessage = answer.statusMessage;
      return reply.send(answer.json);
    case 'text':
      return reply.send(answer.text);
    case 'bytes':
      return reply.send(answer.bytes);
    case 'stream':
      return reply.send(answer.stream());
    case 'file':
      return reply.send(createReadStream(answer.file));
    case 'events': {
      // Server-sent events the usual Fastify way: take over the raw response.
      reply.hijack();
      reply.raw.writeHead(answer.status, answer.headers);
      for (const event of answer.events) reply.raw.write(event);
      reply.raw.end();
      return reply;
    }
    case 'broken':
      // A body piped the raw way, which Fastify leaves alone: its failure destroys the response.
      reply.hijack();
      pipeline(answer.stream(), reply.raw, ignore);
      return reply;
    case 'none':
      return reply.send();
  }
}

function ignore() {
  // The pipeline's failure is the scenario: it destroyed the response.
}
