// A client that leaves while Koa still has to write a body JSON cannot write (a BigInt, a cycle): without
// idem, Koa's respond skips the write for a client gone, or answers 500 when its JSON.stringify throws.
import { memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { abandonedPost, clientLeaves, eventLog, listen } from './support.js';

it('client gone before the handler returns a body JSON cannot write: the outcome is settled, not left in progress', async () => {
  // Settled as Koa would have answered (its JSON.stringify throws: a 500). A throw out of runNext before
  // handlerReturned would leave the capture open, and the heartbeat renewing the lease for as long as
  // the process lives (409 forever).
  const log = eventLog();
  const store = memoryStore();
  const leaving = clientLeaves();
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1', onEvent: log.onEvent }));
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  app.use(async (ctx) => {
    await leaving.untilGone(ctx);
    ctx.status = 201;
    ctx.body = { id: 1n };
    setImmediate(returned);
  });
  await listen(app, async (url) => {
    await abandonedPost(url, 'gone-bigint', leaving.running);
    await handlerReturned;
    // The memory store settles at once: a settled outcome shows by now.
    expect(log.events.map((event) => event.type)).not.toEqual(['claim']);
    const record = await store.get(recordId('tenant-1', 'POST /', 'gone-bigint'));
    expect(record).toMatchObject({ state: 'completed', response: { status: 500 } });
  });
});

it('client gone while middleware above awaits, with a body JSON cannot write: nothing is thrown out of the response close', async () => {
  // The close listener settles the outcome without throwing. A throw there (responseOf's JSON.stringify)
  // would be an uncaughtException that ends the process, where Koa alone would have skipped the write.
  const thrown: unknown[] = [];
  let handlerReturned!: () => void;
  const returned = new Promise<void>((resolve) => {
    handlerReturned = resolve;
  });
  let closed!: () => void;
  const responseClosed = new Promise<void>((resolve) => {
    closed = resolve;
  });
  const app = new Koa();
  app.use(async (ctx, next) => {
    // What escapes a listener of the response's events is caught here, instead of by the process.
    const emit = ctx.res.emit;
    ctx.res.emit = function (this: typeof ctx.res, name: string | symbol, ...args: unknown[]) {
      try {
        return emit.call(this, name, ...args);
      } catch (error) {
        thrown.push(error);
        return true;
      } finally {
        if (name === 'close') closed();
      }
    } as typeof ctx.res.emit;
    await next();
    handlerReturned();
    // A session saved, a log flushed: middleware above the handler still awaits when the client leaves.
    await responseClosed;
  });
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
  app.use(async (ctx) => {
    ctx.status = 201;
    ctx.body = { id: 1n };
  });
  await listen(app, async (url) => {
    await abandonedPost(url, 'gone-after-return', returned);
    await responseClosed;
    expect(thrown).toEqual([]);
  });
});
