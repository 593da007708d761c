import { createHash, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import { calculateJwkThumbprint } from 'jose';
import Koa, { type Context, type Middleware } from 'koa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { captureWarnings } from '../../core/test/support/warnings.js';
import {
  AUDIENCE,
  b64url,
  ISSUER,
  makeToken,
  SECRET,
  START_MS,
  signSegments,
  testKeys,
} from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

// What optional guards answer is the shared table's (describeAuthGlue); here, what it does not
// build: two idempotency middlewares stacked behind an optional guard, the glue options, checked
// when the middleware is made, and Koa's error answer, which drops headers set before a throw.

// A tiny exact-path router, so the test depends on nothing but Koa itself.
function route(method: string, path: string, ...stack: Middleware[]): Middleware {
  const composed = stack.reduceRight<(ctx: Context) => Promise<void>>(
    (next, middleware) => async (ctx) => {
      await middleware(ctx, () => next(ctx));
    },
    async () => {},
  );
  return async (ctx, next) => {
    if (ctx.path === path && ctx.method === method) await composed(ctx);
    else await next();
  };
}

describe('Koa guard(edge, { optional: true }) before two stacked idempotency middlewares', () => {
  const edge = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
  const optional = guard(edge, { optional: true });
  let runs = 0;
  let url = '';
  let close: () => Promise<void> = async () => {};

  beforeAll(async () => {
    const app = new Koa();
    // Two middlewares stacked: the first (a scope that needs no caller) governs, the second (none)
    // steps aside, its anonymous check included.
    app.use(
      route(
        'POST',
        '/stacked-charge',
        optional,
        idempotency({ store: memoryStore(), scope: () => 'everyone' }),
        idempotency({ store: memoryStore() }),
        async (ctx) => {
          ctx.status = 201;
          ctx.body = { n: ++runs };
        },
      ),
    );
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      });
  });
  afterAll(() => close());

  it('an anonymous write through two stacked middlewares is governed by the first: served and replayed, no 401', async () => {
    const warnings = captureWarnings();
    try {
      const post = () =>
        fetch(`${url}/stacked-charge`, { method: 'POST', headers: { 'idempotency-key': 'anon-stacked' } });
      const first = await post();
      expect(first.status).toBe(201);
      const { n } = await first.json();
      const again = await post();
      expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([201, 'true']);
      expect(await again.json()).toEqual({ n });
    } finally {
      warnings.stop();
    }
  });

  it('bad glue options are a TypeError when the middleware is made, not a guard that is silently required', () => {
    expect(() => guard(edge, { optional: 'yes' as never })).toThrow(/optional must be a boolean/);
    expect(() => guard(edge, true as never)).toThrow(TypeError);
    expect(() => guard(edge, null as never)).toThrow(TypeError);
  });
});

// The next DPoP nonce (a proof whose nonce is of the last window) is set on the response before
// `next()`, and Koa's error handling removes every header set before a throw (it answers with the
// error's own `headers`). Without the glue's care a handler that throws (`ctx.throw(409)`) would
// answer without `DPoP-Nonce`, where Express and Fastify keep it, and the client would spend its
// next request on a `use_dpop_nonce` refusal once the old window is gone.
describe('Koa: the next DPoP nonce on an error thrown downstream', () => {
  // ctx.throw's own error; one with headers of its own, which stay; one whose headers are
  // read-only, which cannot carry the nonce and is answered as before; a thrown string, which Koa
  // wraps in an error of its own.
  const throwers: Array<[string, Middleware, number, Record<string, string>]> = [
    ['ctx.throw(409)', (ctx) => ctx.throw(409, 'conflict'), 409, {}],
    [
      'an error with headers of its own',
      (ctx) => ctx.throw(429, 'slow down', { headers: { 'Retry-After': '5' } }),
      429,
      { 'retry-after': '5' },
    ],
    [
      'an error whose headers are read-only',
      () => {
        const error = Object.assign(new Error('teapot'), { status: 418, expose: true });
        throw Object.defineProperty(error, 'headers', { value: { 'X-Kept': 'yes' }, writable: false });
      },
      418,
      { 'x-kept': 'yes' },
    ],
    [
      'a thrown string',
      () => {
        throw 'not an error';
      },
      500,
      {},
    ],
  ];
  it.each(throwers)(
    '%s: answered with its status and headers, and with the next DPoP-Nonce when it can carry it',
    async (_, thrower, status, headers) => {
      let nowMs = START_MS;
      const nonceGuard = createGuard({
        audience: AUDIENCE,
        now: () => nowMs,
        dpop: {
          origin: 'https://api.example',
          nonce: { secret: 'the koa test nonce secret, 32 bytes+', lifetime: 60 },
        },
        issuers: [{ issuer: ISSUER, secret: SECRET }],
      });
      const pair = testKeys().ec;
      const token = makeToken({
        now: START_MS,
        claims: {
          cnf: { jkt: await calculateJwkThumbprint(pair.publicJwk as never, 'sha256') },
          exp: START_MS / 1000 + 3600,
        },
      });
      const app = new Koa();
      app.use(guard(nonceGuard));
      app.silent = true;
      app.use(thrower);
      const server = app.listen(0, '127.0.0.1');
      await new Promise<void>((resolve) => server.once('listening', () => resolve()));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/orders`;
      const send = (nonce?: string) =>
        fetch(url, {
          headers: {
            authorization: `DPoP ${token}`,
            dpop: signSegments(
              b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: pair.publicJwk }),
              b64url({
                jti: randomUUID(),
                htm: 'GET',
                htu: 'https://api.example/orders',
                iat: Math.floor(nowMs / 1000),
                ath: createHash('sha256').update(token).digest('base64url'),
                ...(nonce === undefined ? {} : { nonce }),
              }),
              'ES256',
              pair.privateKey,
            ),
          },
        });
      try {
        const nonce = (await send()).headers.get('dpop-nonce') as string;
        expect(nonce).toMatch(/\./);
        // A window on: the nonce is of the last window, so the guard hands out the next with the answer.
        nowMs += 60_000;
        const late = await send(nonce);
        expect(late.status).toBe(status);
        for (const [name, value] of Object.entries(headers)) expect(late.headers.get(name)).toBe(value);
        const next = late.headers.get('dpop-nonce');
        if (status === 418 || status === 500) expect(next).toBeNull();
        else {
          expect(next).toMatch(/\./);
          expect(next).not.toBe(nonce);
        }
      } finally {
        server.closeAllConnections();
        server.close();
      }
    },
  );
});
