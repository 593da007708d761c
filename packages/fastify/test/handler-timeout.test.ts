// Fastify's own `handlerTimeout` (a route's or the server's) answers a slow handler's request with
// its 503 FST_ERR_HANDLER_TIMEOUT while the handler runs on: the answer of a timer, not of the
// operation, as connect-timeout's is on Express and koa-timeout's on Koa. Stored as the key's outcome,
// it was replayed for the whole retention though the handler went on and did its work; under a
// policy that releases a 5xx, the retry ran the handler a second time, concurrently.
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import { transactionalMemoryStore } from '@idem/testkit';
import Fastify from 'fastify';
import { expect, it } from 'vitest';
import { gatedStore } from '../../core/test/support/gated-store.js';

it("handlerTimeout's 503 is served unstored, and the key kept at once with response_not_replayable: the retry never runs the handler again", async () => {
  const events: IdempotencyEvent[] = [];
  const store = memoryStore();
  const app = Fastify({ handlerTimeout: 50 });
  await app.register(idempotency, { store, scope: () => 'tenant-1', onEvent: (event) => events.push(event) });
  let runs = 0;
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let finished!: () => void;
  const handlerDone = new Promise<void>((resolve) => {
    finished = resolve;
  });
  app.post('/charges', async (_request, reply) => {
    runs++;
    await gate;
    setImmediate(finished);
    return reply.code(201).send({ id: 'ch_1' });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/charges`;
  // Bodiless: Fastify clears its handler timer once the request stream closes, which a read body does.
  const post = () => fetch(url, { method: 'POST', headers: { 'idempotency-key': 'slow-1' } });
  try {
    const first = await post();
    expect(first.status).toBe(503);
    expect((await first.json()).code).toBe('FST_ERR_HANDLER_TIMEOUT');
    expect(first.headers.get('cache-control')).toBe('no-store');
    // Was wrong: the 503 was the stored outcome, replayed here (and for the retention). As for a
    // timer of the app's own that says `answeringForHandler()`: Fastify cannot tell a handler's own
    // `return reply.send(...)` from an answer for it by when its promise settles, so the key is kept
    // at once, whatever the policy says of a 503.
    const during = await post();
    expect(during.status).toBe(500);
    expect(during.headers.get('idempotent-replayed')).toBe('true');
    expect((await during.json()).code).toBe('response_not_replayable');
    open();
    await handlerDone;
    const after = await post();
    expect(after.status).toBe(500);
    expect((await after.json()).code).toBe('response_not_replayable');
    expect(events.find((event) => event.type === 'response-not-stored')).toMatchObject({
      reason: 'answered-early',
      status: 503,
    });
    expect(runs).toBe(1);
  } finally {
    await app.close();
  }
});

it("transactional: handlerTimeout's 503 rolls the transaction back and releases the key, so the retry runs once", async () => {
  const outcomes: string[] = [];
  const store = transactionalMemoryStore({ onOutcome: (_id, outcome) => outcomes.push(outcome) });
  const app = Fastify({ handlerTimeout: 50 });
  await app.register(idempotency, { store, transactional: true, scope: () => 'tenant-1' });
  let runs = 0;
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  app.post('/charges', async (_request, reply) => {
    runs++;
    if (runs === 1) await gate;
    return reply.code(201).send({ id: `ch_${runs}` });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/charges`;
  const post = () => fetch(url, { method: 'POST', headers: { 'idempotency-key': 'slow-tx' } });
  try {
    const first = await post();
    expect(first.status).toBe(503);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    open();
    const retry = await post();
    expect(retry.status).toBe(201);
    expect(await retry.json()).toEqual({ id: 'ch_2' });
    expect(outcomes[0]).not.toBe('committed');
  } finally {
    await app.close();
  }
});

// With a request body, Fastify 5's handlerTimeout never fires: it takes the request stream's 'close'
// for the client leaving, and that stream closes as soon as the parser has read the body, so the
// timer is cleared and `request.signal` aborts (a plain AbortError) before the handler runs
// (fastify/fastify#6725, open; #7033 likewise). Pinned: the handler's own answer is the outcome,
// stored and replayed as any other, and its key is never left in progress. Should Fastify fix it,
// the first answer here becomes its 503, taken as the bodiless one above is, and this test says so.
it('with a JSON body, Fastify never times the handler out (a Fastify bug): its own answer is stored and replayed', async () => {
  for (const where of ['server', 'route'] as const) {
    const events: IdempotencyEvent[] = [];
    const app = Fastify(where === 'server' ? { handlerTimeout: 50 } : {});
    await app.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', onEvent: (e) => events.push(e) });
    const timeout = where === 'route' ? { handlerTimeout: 50 } : {};
    let runs = 0;
    let signalAborted: boolean | undefined;
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    let open!: () => void;
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    app.post('/charges', timeout, async (request, reply) => {
      runs++;
      signalAborted = request.signal.aborted;
      started();
      await gate;
      return reply.code(201).send({ id: 'ch_1', amount: (request.body as { amount: number }).amount });
    });
    // A bodiless request under the same timeout, sent after the first: its 503 says that the first's
    // timer, set earlier, would have fired by then.
    app.post('/clock', { ...timeout, config: { idempotency: false } }, async (_request, reply) => {
      await gate;
      return reply;
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    const post = () =>
      fetch(`${base}/charges`, {
        method: 'POST',
        headers: { 'idempotency-key': `body-${where}`, 'content-type': 'application/json' },
        body: '{"amount":100}',
      });
    try {
      const first = post();
      await running;
      expect((await fetch(`${base}/clock`, { method: 'POST' })).status, where).toBe(503);
      open();
      const answer = await first;
      expect(answer.status, where).toBe(201);
      expect(answer.headers.get('idempotency-key'), where).toBe(`body-${where}`);
      expect(signalAborted, where).toBe(true);
      const retry = await post();
      expect(retry.status, where).toBe(201);
      expect(retry.headers.get('idempotent-replayed'), where).toBe('true');
      expect(await retry.json(), where).toEqual({ id: 'ch_1', amount: 100 });
      expect(runs, where).toBe(1);
      expect(events.map((event) => event.type)).toEqual(['claim', 'complete', 'replay']);
    } finally {
      await app.close();
    }
  }
});

// The timer can also fire while the key is being claimed (a slow store round trip): Fastify's 503 is
// out before the handler could run, so the claim that lands after it is released, never left in
// progress, and the retry runs the handler once.
it('handlerTimeout firing while the key is claimed: the claim is released and the retry runs', async () => {
  const events: IdempotencyEvent[] = [];
  let settled!: () => void;
  const released = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const gated = gatedStore();
  const app = Fastify({ handlerTimeout: 50 });
  const onEvent = (event: IdempotencyEvent) => {
    events.push(event);
    if (event.type === 'release') settled();
  };
  await app.register(idempotency, { store: gated.store, scope: () => 'tenant-1', onEvent });
  let runs = 0;
  app.post('/charges', async (_request, reply) => {
    runs++;
    return reply.code(201).send({ id: `ch_${runs}` });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/charges`;
  const post = () => fetch(url, { method: 'POST', headers: { 'idempotency-key': 'slow-claim' } });
  try {
    const first = await post();
    expect(first.status).toBe(503);
    expect((await first.json()).code).toBe('FST_ERR_HANDLER_TIMEOUT');
    gated.open();
    await released;
    const retry = await post();
    expect(retry.status).toBe(201);
    expect(await retry.json()).toEqual({ id: 'ch_1' });
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(events.map((event) => event.type).slice(0, 2)).toEqual(['claim', 'release']);
    expect(runs).toBe(1);
  } finally {
    await app.close();
  }
});
