// Leaks a long-running service would accumulate, found by an audit; each test failed when written.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, recordId } from '@idem/core';
import { expect, it } from 'vitest';
import { gatedStore, settledTypes } from '../../core/test/support/gated-store.js';
import { app } from './support.js';

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
    // Since a client gone during the claim gets no handler at all (client-gone-during-claim.test.ts),
    // the handler never returns: the key is released at once. (Before, the handler ran, and its reply
    // settled the key.)
    void handlerReturned;
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
    expect(events.map((event) => event.type)).toEqual(['claim', 'release']);
    expect(await gated.inner.get(recordId('tenant-leak', 'POST /charges', 'gone-during-claim'))).toBeUndefined();
  } finally {
    await instance.close();
  }
});
