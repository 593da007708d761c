// databaseUnavailable (src/idp/unavailable.ts) on a real Koa app, for what the IdP's integration test
// cannot reach cheaply: an error thrown by a middleware of ours outside oidc-provider's own handler
// (ownPages reads user names for the account-switch page), and the server_error event of the
// provider's handler, told apart from a bug.
import { EventEmitter } from 'node:events';
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import type Provider from 'oidc-provider';
import { afterEach, describe, expect, it } from 'vitest';
import { databaseUnavailable } from '../src/idp/unavailable.js';

const terminated = () =>
  Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });

const servers: Array<{ close(done: () => void): void }> = [];
afterEach(async () => {
  for (const server of servers.splice(0)) await new Promise<void>((done) => server.close(done));
});

/** A Koa app with the middleware in front of `inner`, on an ephemeral port; `provider` emits its events. */
async function serve(inner: Koa.Middleware) {
  const provider = new EventEmitter();
  const app = new Koa();
  app.silent = true;
  app.use(databaseUnavailable(provider as unknown as Provider));
  app.use(inner);
  const server = app.listen(0, '127.0.0.1');
  servers.push(server);
  await new Promise((resolve) => server.once('listening', resolve));
  return { provider, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` };
}

describe('databaseUnavailable', () => {
  it('answers a database failure thrown past the provider 503 with Retry-After; a bug stays 500', async () => {
    const down = await serve(async () => {
      throw terminated();
    });
    const answer = await fetch(down.url);
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(await answer.text()).toContain('Try again in a moment');

    const bug = await serve(async () => {
      throw new TypeError('Cannot read properties of undefined');
    });
    const failed = await fetch(bug.url);
    expect(failed.status).toBe(500);
    expect(failed.headers.get('retry-after')).toBeNull();
  });

  it("turns the provider's 500 server_error into 503 temporarily_unavailable only for a database failure", async () => {
    let error: Error = terminated();
    const { provider, url } = await serve(async (ctx) => {
      // As oidc-provider's error handler does: the status and body set, then the event.
      ctx.status = 500;
      ctx.body = { error: 'server_error', error_description: 'oops! something went wrong' };
      provider.emit('server_error', ctx, error);
    });
    const answer = await fetch(url);
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(await answer.json()).toMatchObject({ error: 'temporarily_unavailable' });
    error = new TypeError('a bug');
    const bug = await fetch(url);
    expect(bug.status).toBe(500);
    expect(await bug.json()).toMatchObject({ error: 'server_error' });
  });
});
