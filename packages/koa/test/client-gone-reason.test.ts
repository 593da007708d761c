// A client that leaves while the handler works: Koa skips its write, and the outcome is stored from
// what the handler left (settleUnwritten). It must say what Koa would have said to a client that
// stayed, its own reason phrase (`ctx.message`) included: a replay is the first answer again.
import { memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { abandonedPost, clientLeaves, listen } from './support.js';

const post = (url: string, key: string) =>
  fetch(url, { method: 'POST', headers: { 'idempotency-key': key, 'content-type': 'application/json' }, body: '{}' });

it("client gone: the handler's own reason phrase is stored and replayed, as for a client that stayed", async () => {
  const store = memoryStore();
  const leaving = clientLeaves();
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.use(async (ctx) => {
    const gone = ctx.get('idempotency-key').startsWith('gone');
    if (gone) await leaving.untilGone(ctx);
    ctx.status = 201;
    ctx.message = 'Created Fine';
    ctx.body = { id: 'ch_1' };
    if (gone) setImmediate(returned);
  });
  await listen(app, async (url) => {
    // A client that stays: the capture reads the phrase off the head Koa writes.
    expect((await post(url, 'here-1')).statusText).toBe('Created Fine');
    expect((await post(url, 'here-1')).statusText).toBe('Created Fine');
    await abandonedPost(url, 'gone-1', leaving.running);
    await handlerReturned;
    const record = await store.get(recordId('tenant-1', 'POST /', 'gone-1'));
    // Was wrong: stored without it, so the replay said `201 Created`.
    expect(record).toMatchObject({ state: 'completed', response: { status: 201, statusMessage: 'Created Fine' } });
    const retry = await post(url, 'gone-1');
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.statusText).toBe('Created Fine');
  });
});

it('client gone: a phrase that is only the status default is stored as none, as for a client that stayed', async () => {
  const store = memoryStore();
  const leaving = clientLeaves();
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.use(async (ctx) => {
    await leaving.untilGone(ctx);
    ctx.status = 201;
    ctx.body = { id: 'ch_1' };
    setImmediate(returned);
  });
  await listen(app, async (url) => {
    await abandonedPost(url, 'gone-2', leaving.running);
    await handlerReturned;
    const record = await store.get(recordId('tenant-1', 'POST /', 'gone-2'));
    expect(record).toMatchObject({ state: 'completed', response: { status: 201 } });
    expect((record as { response: { statusMessage?: string } }).response.statusMessage).toBeUndefined();
  });
});

it("client gone, the handler throws: the outcome stored is the answer Koa's error handler would have written, as for a client that stayed", async () => {
  // Koa's ctx.onerror answers `err.status || err.statusCode` when it is a status it knows (else 500),
  // with the error's message as the body when it is exposed (http-errors' 4xx, `ctx.throw(409, '...')`),
  // and the error's own `headers`. Settled for a client gone, the record must say the same.
  const errors: Record<string, () => Error> = {
    exposed: () => Object.assign(new Error('card taken'), { status: 409, expose: true }),
    statusCode: () => Object.assign(new Error('unprocessable'), { statusCode: 422 }),
    textStatus: () => Object.assign(new Error('text status'), { status: '409' }),
    unknownStatus: () => Object.assign(new Error('unknown status'), { status: 999 }),
    withHeaders: () =>
      Object.assign(new Error('moved'), { status: 409, expose: true, headers: { Location: '/charges/ch_9' } }),
  };
  const store = memoryStore();
  let leaving = clientLeaves();
  let returned!: () => void;
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.use(async (ctx) => {
    const [where, name] = ctx.get('idempotency-key').split(':') as [string, string];
    if (where === 'gone') {
      await leaving.untilGone(ctx);
      setImmediate(returned);
    }
    throw (errors[name] as () => Error)();
  });
  const stored = async (key: string) => {
    const record = await store.get(recordId('tenant-1', 'POST /', key));
    const response = (
      record as {
        response: { status: number; headers: Record<string, string>; body: Uint8Array; statusMessage?: string };
      }
    ).response;
    return {
      status: response.status,
      statusMessage: response.statusMessage,
      headers: response.headers,
      body: Buffer.from(response.body).toString(),
    };
  };
  await listen(app, async (url) => {
    for (const name of Object.keys(errors)) {
      await post(url, `here:${name}`);
      const handlerReturned = new Promise<void>((resolve) => {
        returned = resolve;
      });
      await abandonedPost(url, `gone:${name}`, leaving.running);
      await handlerReturned;
      leaving = clientLeaves();
      // Was wrong: stored as `Number(err.status) || 500` with the status's text, whatever the error said.
      expect(await stored(`gone:${name}`), name).toEqual(await stored(`here:${name}`));
    }
  });
});
