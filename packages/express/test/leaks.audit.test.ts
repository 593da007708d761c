// Leaks a long-running service would accumulate, found by an audit; each test failed when written.
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEvent, recordId } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';
import { gatedStore, settledOrRenewed } from '../../core/test/support/gated-store.js';

const file = fileURLToPath(import.meta.url);

// Was a defect: client gone during the claim, then res.sendFile gives up: the lease is never settled and the heartbeat renews it forever (one held lease + renewals per such request); expected: settled as a file cut short, as when the client leaves during the handler.
it('client gone during the claim (store round trip), then res.sendFile: the key is settled, not renewed for good', async () => {
  const gated = gatedStore();
  const events: IdempotencyEvent[] = [];
  let piped!: (error: unknown) => void;
  const sendFileDone = new Promise<unknown>((resolve) => {
    piped = resolve;
  });
  let serverClosed!: () => void;
  const closedOnServer = new Promise<void>((resolve) => {
    serverClosed = resolve;
  });
  const app = express();
  app.use((_req, res, next) => {
    res.once('close', () => serverClosed());
    next();
  });
  app.use(
    idempotency({
      store: gated.store,
      scope: () => 'tenant-leak',
      lease: '300ms',
      onEvent: (event) => events.push(event),
    }),
  );
  app.post('/exports', (_req, res) => {
    res.status(201).sendFile(file, (error) => setImmediate(piped, error));
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    await abandonedPost(`${url}/exports`, 'gone-during-claim', gated.claiming);
    await closedOnServer;
    gated.open();
    // Since a client gone during the claim gets no handler at all (client-gone-during-claim.audit
    // .test.ts), sendFile never starts: the key is released at once. (Before, sendFile gave up on the
    // aborted request with ECONNABORTED, and the capture settled it as a file cut short.)
    void sendFileDone;
    // Settled by now, or else renewed on and on: three renewals after the pipeline failed tell them apart.
    expect(await settledOrRenewed(gated, events)).toBe('settled');
    expect(events.map((event) => event.type)).toEqual(['claim', 'release']);
    expect(await gated.inner.get(recordId('tenant-leak', 'POST /exports', 'gone-during-claim'))).toBeUndefined();
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
