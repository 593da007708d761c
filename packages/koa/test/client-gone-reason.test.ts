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
