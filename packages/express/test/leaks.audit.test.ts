// Leaks a long-running service would accumulate: audit tests (each it.fails passes while the defect exists).
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEvent, memoryStore, recordId, type Store } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';

const file = fileURLToPath(import.meta.url);

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
    const req = httpRequest(`${url}/exports`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone-during-claim', 'content-type': 'application/json', 'content-length': '2' },
    });
    req.on('error', () => undefined);
    req.end('{}');
    await gated.claiming;
    req.destroy();
    await closedOnServer;
    gated.open();
    // sendFile gives up on the aborted request (ECONNABORTED) and ends nothing, as when the client leaves later.
    expect(((await sendFileDone) as { code?: string } | undefined)?.code).toBe('ECONNABORTED');
    // Settled by now, or else renewed on and on: three renewals after the pipeline failed tell them apart.
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
    expect((await gated.inner.get(recordId('tenant-leak', 'POST /exports', 'gone-during-claim')))?.state).not.toBe(
      'in_progress',
    );
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
