// Leaks a long-running service would accumulate: audit tests (each it.fails passes while the defect exists).
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore, recordId, type Store } from '@idem/core';
import { expect, it } from 'vitest';
import { app } from './support.js';

// A shared store (not in this process) whose first claim waits until the test lets it answer: the
// window a real Redis or PostgreSQL round trip leaves between the request and the capture.
function gatedStore() {
  const inner = memoryStore();
  let claimed!: () => void;
  const claiming = new Promise<void>((resolve) => {
    claimed = resolve;
  });
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let renewals = 0;
  let onRenew: (() => void) | undefined;
  const store: Store = {
    inProcess: false,
    async claim(input) {
      claimed();
      await gate;
      return inner.claim(input);
    },
    async renew(input) {
      renewals++;
      onRenew?.();
      return inner.renew(input);
    },
    async complete(input) {
      return inner.complete(input);
    },
    async release(input) {
      return inner.release(input);
    },
    async get(id) {
      return inner.get(id);
    },
  };
  return {
    store,
    inner,
    claiming,
    open,
    renewals: () => renewals,
    // Resolves after `n` more renewals.
    renewed(n: number) {
      const target = renewals + n;
      return new Promise<void>((resolve) => {
        onRenew = () => {
          if (renewals >= target) resolve();
        };
      });
    },
  };
}

const settledTypes = new Set(['complete', 'release', 'not-stored', 'lease-lost']);

// Was a defect: client gone during the claim, then an async handler returns nothing (Fastify skips reply.send for an aborted request): the lease is never settled and the heartbeat renews it forever; expected: settled from the reply, as when the client leaves during the handler.
it('client gone during the claim (store round trip), async handler returns nothing: the key is settled, not renewed for good', async () => {
  const gated = gatedStore();
  const events: IdempotencyEvent[] = [];
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  let serverClosed!: () => void;
  const closedOnServer = new Promise<void>((resolve) => {
    serverClosed = resolve;
  });
  const instance = await app(
    { store: gated.store, scope: () => 'tenant-leak', lease: '300ms', onEvent: (event) => events.push(event) },
    (a) => {
      a.addHook('onRequest', async (request) => {
        request.raw.socket.once('close', () => serverClosed());
      });
      a.post('/charges', async (_request, reply) => {
        reply.code(204);
        setImmediate(returned);
      });
    },
  );
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
  try {
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone-during-claim', 'content-type': 'application/json', 'content-length': '12' },
    });
    req.on('error', () => undefined);
    req.end('{"amount":1}');
    await gated.claiming;
    req.destroy();
    await closedOnServer;
    gated.open();
    await handlerReturned;
    let check: ReturnType<typeof setInterval> | undefined;
    const settledOrRenewed = await Promise.race([
      new Promise<string>((resolve) => {
        check = setInterval(() => {
          if (events.some((event) => settledTypes.has(event.type))) resolve('settled');
        }, 5);
      }),
      gated.renewed(3).then(() => 'renewed'),
    ]).finally(() => clearInterval(check));
    expect(settledOrRenewed).toBe('settled');
    expect((await gated.inner.get(recordId('tenant-leak', 'POST /charges', 'gone-during-claim')))?.state).not.toBe(
      'in_progress',
    );
  } finally {
    await instance.close();
  }
});
