// What the Koa test files share.
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import type Koa from 'koa';

/** Runs `run` against `app` listening on an ephemeral loopback port, then closes every connection. */
export async function listen(app: Koa, run: (url: string) => Promise<void>) {
  app.silent = true;
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

// Events as they come, and a way to wait for the first of some types without sleeping.
export function eventLog() {
  const events: IdempotencyEvent[] = [];
  const waiters: { types: string[]; resolve: (event: IdempotencyEvent) => void }[] = [];
  return {
    events,
    onEvent(event: IdempotencyEvent) {
      events.push(event);
      for (const waiter of waiters.splice(0)) {
        if (waiter.types.includes(event.type)) waiter.resolve(event);
        else waiters.push(waiter);
      }
    },
    /** The first event of one of `types` from the `from`-th event on. */
    next(from: number, ...types: IdempotencyEvent['type'][]): Promise<IdempotencyEvent> {
      const seen = events.slice(from).find((event) => types.includes(event.type));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve) => waiters.push({ types, resolve }));
    },
  };
}

// A client that leaves while the handler works: a handler awaits `untilGone(ctx)`, which tells
// `running` it started and returns once the client has gone (see abandonedPost).
export function clientLeaves() {
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  return {
    running,
    async untilGone(ctx: Koa.Context) {
      const closed = new Promise((resolve) => ctx.res.once('close', resolve));
      started();
      await closed;
    },
  };
}

// Sends a request and drops the connection once the handler is running (shared with the other adapters).
export { abandonedPost } from '../../core/test/support/client-gone.js';
