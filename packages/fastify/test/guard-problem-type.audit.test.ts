// The Content-Type of the guard's refusals on Fastify, as a client reads it off the wire. docs/guard.md
// shows `Content-Type: application/problem+json`; Express and Koa send exactly that, and so does the
// Fastify idempotency plugin for its own problems (400, 409, 422, 413, 503). A client (or a gateway
// rule) that compares the media type as a string sees Fastify's 401 and 403 differ.
import { createHmac, randomUUID } from 'node:crypto';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { requireScopes } from '@idem/guard';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authorize, guard } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

const ISSUER = 'https://id.problem-type.test';
const AUDIENCE = 'https://api.problem-type.test';
const SECRET = 'a-problem-type-audit-secret-of-32-bytes-at-least!';

function token(scope: string): string {
  const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const now = Math.floor(Date.now() / 1000);
  const head = `${b64({ alg: 'HS256', typ: 'at+jwt' })}.${b64({ iss: ISSUER, aud: AUDIENCE, sub: 'u1', scope, iat: now, exp: now + 600, client_id: 'c' })}`;
  return `${head}.${createHmac('sha256', SECRET).update(head).digest('base64url')}`;
}

let app: FastifyInstance;
let port: number;
beforeAll(async () => {
  app = Fastify();
  const verify = guard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
  app.addHook('onRequest', verify);
  await app.register(idempotency, { store: memoryStore() });
  app.post('/orders', { onRequest: authorize(requireScopes('orders:write')) }, async (_request, reply) =>
    reply.code(201).send({ ok: true }),
  );
  await app.listen({ port: 0, host: '127.0.0.1' });
  port = (app.server.address() as AddressInfo).port;
});
afterAll(async () => {
  await app?.close();
});

function post(headers: Record<string, string>): Promise<{ status: number; type: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method: 'POST', path: '/orders', headers }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'] }));
    });
    req.on('error', reject);
    req.end('{}');
  });
}

describe('Fastify: the guard refusals have the same media type as every other problem', () => {
  it('the plugin’s own 400 is application/problem+json (the reference)', async () => {
    const answer = await post({ authorization: `Bearer ${token('orders:write')}`, 'content-type': 'application/json' });
    expect(answer).toEqual({ status: 400, type: 'application/problem+json' });
  });

  // Was a defect: sendGuardError (packages/fastify/src/auth-state.ts) answers with
  // `reply.type('application/problem+json').send(string)`, and Fastify appends `; charset=utf-8` to
  // the type of a string payload, so the 401 and 403 say `application/problem+json; charset=utf-8`
  // where Express, Koa, docs/guard.md and the plugin's own problems say `application/problem+json`.
  // Fix: send the JSON as a Buffer (Fastify then leaves the type alone), or write the problem with
  // core's writeResponse as the idempotency plugin does.
  it('401 (no token) and 403 (insufficient_scope) are application/problem+json', async () => {
    const missing = await post({ 'content-type': 'application/json', 'idempotency-key': randomUUID() });
    const forbidden = await post({
      authorization: `Bearer ${token('orders:read')}`,
      'content-type': 'application/json',
      'idempotency-key': randomUUID(),
    });
    expect([missing, forbidden]).toEqual([
      { status: 401, type: 'application/problem+json' },
      { status: 403, type: 'application/problem+json' },
    ]);
  });
});
