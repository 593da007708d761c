// Leaks a long-running service would accumulate, found by an audit; each test failed when written.
import { type IdempotencyEvent, recordId } from '@idem/core';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';
import { gatedStore, settledOrRenewed } from '../../core/test/support/gated-store.js';
import { app, listening } from './support.js';

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
  const url = await listening(instance);
  try {
    await abandonedPost(`${url}/charges`, 'gone-during-claim', gated.claiming, '{"amount":1}');
    await closedOnServer;
    gated.open();
    // Since a client gone during the claim gets no handler at all (client-gone-during-claim.test.ts),
    // the handler never returns: the key is released at once. (Before, the handler ran, and its reply
    // settled the key.)
    void handlerReturned;
    expect(await settledOrRenewed(gated, events)).toBe('settled');
    expect(events.map((event) => event.type)).toEqual(['claim', 'release']);
    expect(await gated.inner.get(recordId('tenant-leak', 'POST /charges', 'gone-during-claim'))).toBeUndefined();
  } finally {
    await instance.close();
  }
});
