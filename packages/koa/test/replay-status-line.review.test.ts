// Koa sets the reason phrase with the status: `ctx.status = 200` in a middleware above idempotency()
// leaves "OK" on the response. A replay (or an idem refusal) written over it must say its own status's.
import http from 'node:http';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { listen } from '../../core/test/support/timeouts-kit.js';

function post(url: string, key: string): Promise<{ status: number; statusMessage: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: 'POST', agent: false, headers: { 'idempotency-key': key, 'content-length': 0 } },
      (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0, statusMessage: res.statusMessage ?? '' }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

describe('Koa: a status set above idempotency() before it answers', () => {
  // Was wrong: the replay went out as "201 OK", the phrase Koa had set for the 200 above.
  it('does not lend its reason phrase to a replay', async () => {
    const app = new Koa();
    app.silent = true;
    app.use(async (ctx, next) => {
      ctx.status = 200;
      await next();
    });
    app.use(idempotency({ store: memoryStore(), scope: () => 'user-1' }));
    app.use(async (ctx) => {
      ctx.status = 201;
      ctx.body = { ok: true };
    });
    const server = await listen(http.createServer(app.callback()));
    try {
      expect(await post(`${server.url}/charges`, 'k-1')).toEqual({ status: 201, statusMessage: 'Created' });
      expect(await post(`${server.url}/charges`, 'k-1')).toEqual({ status: 201, statusMessage: 'Created' });
      // A refusal too: a malformed key is 400.
      expect(await post(`${server.url}/charges`, '')).toEqual({ status: 400, statusMessage: 'Bad Request' });
    } finally {
      await server.close();
    }
  });
});
