// A client that leaves while its claim waits on a slow store (an overloaded pool or Redis): the
// request's body is in hand (the middleware read it to fingerprint it), but by the time the claim
// answers the socket is closed.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore, recordId, type Store } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';

// The memory store behind a network whose claims wait until `open()`: a store slowed by overload.
function slowClaims() {
  const inner = memoryStore();
  let open = () => {};
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let claimed = () => {};
  const asked = new Promise<void>((resolve) => {
    claimed = resolve;
  });
  const store: Store = {
    claim: async (input) => {
      claimed();
      await gate;
      return inner.claim(input);
    },
    renew: async (input) => inner.renew(input),
    complete: async (input) => inner.complete(input),
    release: async (input) => inner.release(input),
    get: async (id) => inner.get(id),
  };
  return { store, open, asked };
}

// Was wrong: the middleware reads the body, puts it back, then awaits the claim; a client that
// timed out meanwhile has closed its socket, and body-parser (express.json) takes a request whose
// socket is no longer readable for one already parsed (on-finished's isFinished) and passes it on
// with no body. The handler ran with `req.body` undefined, failed, and its 500 was stored and
// replayed to every retry for the whole retention, though the request the client sent never ran
// (in the audit's Express load run, Pool of 2, 1,500 new keys a second, 1,579 keys). A client gone
// before the handler starts now gets no handler: the key is released, and its retry runs.
it('a client gone while its claim waited: the handler does not run without its body, and the key is not kept with a 500', async () => {
  const { store, open, asked } = slowClaims();
  const seen: unknown[] = [];
  const app = express();
  app.post('/charges', idempotency({ store, scope: () => 'tenant-1' }), express.json(), (req, res) => {
    seen.push(req.body);
    res.status(201).json({ amount: (req.body as { amount: number }).amount });
  });
  app.use(idempotencyErrors());
  app.use((_error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    res.status(500).json({ error: 'handler failed' });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  // The server's side of the client's connection: its close is when the server knows the client left.
  const closed = new Promise<void>((resolve) => server.once('connection', (socket) => socket.once('close', resolve)));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const key = 'gone-during-claim';
  try {
    const body = JSON.stringify({ amount: 1000 });
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json', 'content-length': String(body.length) },
    });
    req.on('error', () => undefined);
    req.end(body);
    await asked;
    // The client gives up while the claim waits (its timeout), then the store answers.
    req.destroy();
    await closed;
    open();
    const id = recordId('tenant-1', 'POST /charges', key);
    // Settled one way or the other: stored, or released.
    await expect.poll(async () => (await store.get(id))?.state !== 'in_progress').toBe(true);
    const record = await store.get(id);
    // A handler that runs must get the body the client sent; a stored answer must be its answer.
    for (const got of seen) expect(got).toEqual({ amount: 1000 });
    if (record?.state === 'completed') expect(record.response.status).toBe(201);

    const retry = await fetch(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body,
      signal: AbortSignal.timeout(3000),
    });
    expect(retry.status).toBe(201);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
