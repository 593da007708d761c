// The guard glue's types on an HTTP/2 Fastify instance (`http2: true`), which the idempotency plugin
// and the guard both serve at run time (http2.audit.test.ts, http2-guard.audit.test.ts). This file
// is type-checked by the repository's `tsc -p tsconfig.json --noEmit`: a line the types refuse
// fails the typecheck. The test below runs the same route, so the file asserts at run time too.
//
// Was a defect: `guard()`, `authorize()` and `internalAuth()` were typed `AuthHook = (request:
// FastifyRequest, reply: FastifyReply) => ...`, Fastify's defaults, which name an HTTP/1 server (its
// request's raw is an IncomingMessage, with `headersDistinct`, which Http2ServerRequest lacks). So on
// `Fastify({ http2: true })` the README's `{ onRequest: [authorize(...)] }` was TS2322 under `strict`
// (and `forwardHeaders(request, ...)` TS2345): users cast, as http2-guard.audit.test.ts did
// (`as unknown as onRequestHookHandler[]`). Expected: the hooks and forwardHeaders take a request of
// any server Fastify makes (HTTP/1.1, HTTPS, HTTP/2), with the route's own types left alone.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { createGuard, createInternalTokenIssuer, requireScopes } from '@idem/guard';
import Fastify from 'fastify';
import { afterEach, expect, expectTypeOf, it } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import {
  type AuthHook,
  authorize,
  authPlugin,
  forwardHeaders,
  guard,
  idempotency,
  internalAuth,
} from '../src/index.js';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

const clock = manualClock();
const edge = createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
const internal = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });

// Types only: every instance Fastify makes takes the hooks where the README puts them, and the
// route's params and body keep the types the route gave them.
function typeUses(): void {
  const secure = Fastify({ http2: true, https: { allowHTTP1: true, key: 'key', cert: 'cert' } });
  secure.post<{ Params: { id: string }; Body: { amount: number } }>(
    '/orders/:id',
    { onRequest: [guard(edge), authorize(requireScopes('orders:write'))], preHandler: internalAuth(edge) },
    async (request) => {
      expectTypeOf(request.params.id).toEqualTypeOf<string>();
      expectTypeOf(request.body.amount).toEqualTypeOf<number>();
      return forwardHeaders(request, { audience: 'orders', issuer: internal });
    },
  );
  secure.addHook('onRequest', guard(edge));
  const hooks: AuthHook[] = [guard(edge), authorize(requireScopes('orders:write'))];
  Fastify().route({ method: 'POST', url: '/x', onRequest: hooks, handler: async () => ({}) });
  Fastify({ https: { key: 'key', cert: 'cert' } }).post('/x', { onRequest: hooks }, async () => ({}));
  // @ts-expect-error a hook is no route handler: the request types still apply
  Fastify({ http2: true }).post('/x', { onRequest: 'guard' }, async () => ({}));
}
void typeUses;

it('HTTP/2 (h2c): guard() and authorize() as route hooks, typed without a cast, answer as on HTTP/1.1', async () => {
  const app = Fastify({ http2: true });
  await app.register(authPlugin);
  await app.register(idempotency, { store: memoryStore() });
  app.post(
    '/orders',
    { onRequest: [guard(edge), authorize(requireScopes('orders:write'))] },
    async (request, reply) => {
      const forwarded = await forwardHeaders(request, { audience: 'orders', issuer: internal });
      return reply.code(201).send({ sub: request.auth?.sub, internal: typeof forwarded['idem-internal-token'] });
    },
  );
  await app.listen({ port: 0, host: '127.0.0.1' });
  const session = http2.connect(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  closers.push(async () => {
    session.close();
    await app.close();
  });
  const post = (headers: Record<string, string>) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const stream = session.request({
        ':method': 'POST',
        ':path': '/orders',
        'content-type': 'application/json',
        ...headers,
      });
      let status = 0;
      let body = '';
      stream.on('response', (fields) => {
        status = Number(fields[':status']);
      });
      stream.setEncoding('utf8');
      stream.on('data', (chunk: string) => {
        body += chunk;
      });
      stream.on('end', () => resolve({ status, body }));
      stream.on('error', reject);
      stream.end('{}');
    });

  const scoped = makeToken({ claims: { scope: 'orders:write' } });
  const ok = await post({ authorization: `Bearer ${scoped}`, 'idempotency-key': '"k-1"' });
  expect(ok.status).toBe(201);
  expect(JSON.parse(ok.body)).toEqual({ sub: 'user-1', internal: 'string' });
  const unscoped = await post({ authorization: `Bearer ${makeToken()}`, 'idempotency-key': '"k-2"' });
  expect(unscoped.status).toBe(403);
  expect((await post({ 'idempotency-key': '"k-3"' })).status).toBe(401);
});
