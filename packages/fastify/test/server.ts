// The Fastify server of the describeAdapter table, shared by the memory and the real-store runs.
import { createReadStream } from 'node:fs';
import { idempotency } from '@idem/fastify';
import type { AdapterServerOptions, ScenarioReply } from '@idem/testkit';
import Fastify, { type FastifyReply } from 'fastify';

export async function makeFastifyServer({ idempotency: options, routes, handle }: AdapterServerOptions) {
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
  await app.register(idempotency, options);
  for (const route of routes) {
    app.route({
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
        });
        return write(reply, answer);
      },
    });
  }
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, executions: () => runs, close: () => app.close() };
}

function write(reply: FastifyReply, answer: ScenarioReply) {
  if (answer.kind === 'throw') throw new Error('handler failed');
  reply.code(answer.status).headers(answer.headers);
  switch (answer.kind) {
    case 'json':
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
    case 'none':
      return reply.send();
  }
}
