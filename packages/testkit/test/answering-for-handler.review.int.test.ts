// Review of `IdempotencyContext.answeringForHandler()` (see answering-for-handler.int.test.ts for
// what it is for): the paths its first tests left out. Real sockets; the memory store and Redis.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import type { Store } from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { gate, listen, post, retryPast409, timeoutBackends, until } from '../../core/test/support/timeouts-kit.js';

const backends = await timeoutBackends('answering-for-handler-review');
const auth = { sub: 'user-1', iss: 'https://issuer.test' };

interface Server {
  url: string;
  runs: () => number;
  close: () => Promise<void>;
}

// A handler that streams its 200 (a chunk, then the rest once its timer fired). The timer says
// `answeringForHandler()` and tries its 503, which cannot go out over the head already sent (Fastify's
// send throws, as Node's writeHead does; Express's careful timer checks `headersSent`).
async function streamingServer(framework: 'express' | 'fastify', store: Store, silent = false): Promise<Server> {
  let runs = 0;
  const handle = (say: () => void, answer: () => void) => {
    runs++;
    const body = new Readable({ read() {} });
    const timer = gate();
    setTimeout(() => {
      if (!silent) say();
      try {
        answer();
      } catch {
        // ERR_HTTP_HEADERS_SENT: the head is the handler's.
      }
      timer.open();
    }, 50);
    body.push('first,');
    void timer.promise.then(() => {
      body.push('second');
      body.push(null);
    });
    return body;
  };
  if (framework === 'fastify') {
    const app = Fastify();
    app.addHook('onRequest', async (request) => {
      (request as { auth?: unknown }).auth = auth;
    });
    await app.register(fastifyIdempotency, { store });
    app.post('/charges', async (request, reply) => {
      const body = handle(
        () => request.idempotency?.answeringForHandler(),
        () => void reply.code(503).send('timeout'),
      );
      return reply.header('content-type', 'text/plain').send(body);
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}/charges`, runs: () => runs, close: () => app.close() };
  }
  const app = express();
  app.use((req, _res, next) => {
    (req as { auth?: unknown }).auth = auth;
    next();
  });
  app.use(expressIdempotency({ store }));
  app.post('/charges', (req, res) => {
    const body = handle(
      () => req.idempotency?.answeringForHandler(),
      // A careful timer; or, silent, one that writes the head itself, which Node refuses.
      () => (silent ? res.writeHead(503) : !res.headersSent && res.status(503).send('timeout')),
    );
    res.type('text/plain');
    body.pipe(res);
  });
  const listening = await listen(http.createServer(app));
  return { url: `${listening.url}/charges`, runs: () => runs, close: listening.close };
}

describe.each(backends)('answeringForHandler() on $name', (backend) => {
  // Was wrong: said after the handler's head went out (a timer firing while its handler streams),
  // it marked the response, though no other answer could be written in its place: the handler's
  // whole 200 went out, and the key kept `500 response_not_replayable` ("the server answered before
  // it finished (a timeout)"), every retry losing its replay of an answer its client had in full.
  // Was wrong too: a head Node refused (a second one, over the handler's head already sent) still set
  // the status the capture stores: the client read the handler's 200, and every retry was replayed
  // the refused 503 with the 200's body.
  it.each([
    ['express', 'said once the head went out, it changes nothing', false],
    ['fastify', 'said once the head went out, it changes nothing', false],
    ['express', 'a second head, which Node refuses, leaves the status stored as the one sent', true],
    ['fastify', 'a second head, which Node refuses, leaves the status stored as the one sent', true],
  ] as const)('%s: %s: its whole streamed answer is the outcome, replayed', async (framework, _name, silent) => {
    const server = await streamingServer(framework, backend.store(), silent);
    const key = `${framework}-${silent ? 'head' : 'said'}`;
    try {
      const first = await post(server.url, key);
      expect(first.status).toBe(200);
      expect(first.body).toBe('first,second');
      const again = await retryPast409(server.url, key);
      expect(again.status).toBe(200);
      expect(again.body).toBe('first,second');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(server.runs()).toBe(1);
    } finally {
      await server.close();
    }
  });

  // Held by the fix above: said once the head went out, the answer is not the timeout's, but an error
  // the timeout throws through the chain is still its own. A Koa handler that took the response over
  // streams its 200 while a timeout below idempotency() says so and throws 503 (which Koa cannot write
  // over the head): under 'stripe', taken for the handler's throw, the key was released and the
  // retry ran the handler a second time.
  it.each([undefined, 'stripe'] as const)(
    "koa, policy %s: said once the head went out, the timeout's throw is no failure of the handler: its 200 replayed",
    async (storeOutcome) => {
      const app = new Koa();
      app.silent = true;
      let runs = 0;
      let finished = 0;
      const rest = gate();
      app.use(async (ctx, next) => {
        ctx.state.auth = auth as never;
        await next();
      });
      app.use(koaIdempotency({ store: backend.store(), storeOutcome }));
      app.use(async (ctx, next) => {
        let timer: NodeJS.Timeout | undefined;
        const timedOut = new Promise<never>((_resolve, reject) => {
          timer = setTimeout(() => {
            ctx.state.idempotency?.answeringForHandler();
            reject(Object.assign(new Error('timeout'), { status: 503, expose: true }));
            rest.open();
          }, 50);
        });
        try {
          await Promise.race([next(), timedOut]);
        } finally {
          clearTimeout(timer);
        }
      });
      app.use(async (ctx) => {
        runs++;
        ctx.respond = false;
        ctx.res.writeHead(200, { 'content-type': 'text/plain' });
        ctx.res.write('first,');
        await rest.promise;
        ctx.res.end('second');
        finished++;
      });
      const server = await listen(http.createServer(app.callback()));
      try {
        const first = await post(`${server.url}/charges`, 'k3');
        expect(first.body).toBe('first,second');
        const again = await retryPast409(`${server.url}/charges`, 'k3');
        expect(again.status).toBe(200);
        expect(again.body).toBe('first,second');
        expect(again.headers['idempotent-replayed']).toBe('true');
        await until(() => finished === runs);
        expect(runs).toBe(1);
      } finally {
        rest.open();
        await server.close();
      }
    },
  );

  // Said by a timer that then writes nothing (it checked something else first), the mark stays, and
  // the handler's own 201, written later, is taken as the timeout's answer: its client reads the 201,
  // every retry gets `500 response_not_replayable` (no second run, no replay). Decided: documented
  // ("call it just before writing"; once said, the next answer is the timeout's). Letting the mark
  // lapse at the end of the timer's turn would lose it for an answer that leaves after an await (an
  // async onSend hook), and a way to take it back would be API for a misuse.
  it("express: said, then nothing written: the handler's own 201 goes out, the key keeps 500 response_not_replayable", async () => {
    const app = express();
    app.use((req, _res, next) => {
      (req as { auth?: unknown }).auth = auth;
      next();
    });
    app.use(expressIdempotency({ store: backend.store() }));
    let runs = 0;
    app.post('/charges', async (req, res) => {
      runs++;
      const fired = gate();
      setTimeout(() => {
        req.idempotency?.answeringForHandler();
        fired.open();
      }, 20);
      await fired.promise;
      res.status(201).json({ id: 'ch_1' });
    });
    const server = await listen(http.createServer(app));
    try {
      expect((await post(`${server.url}/charges`, 'k4')).status).toBe(201);
      const again = await retryPast409(`${server.url}/charges`, 'k4');
      expect(runs).toBe(1);
      expect(again.status).toBe(500);
      expect(JSON.parse(again.body)).toMatchObject({ code: 'response_not_replayable' });
    } finally {
      await server.close();
    }
  });
});
