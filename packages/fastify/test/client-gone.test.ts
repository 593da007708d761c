// A client that leaves while the handler works, on a real socket (app.inject has no connection to drop).
import type { IdempotencyEvent } from '@idem/core';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';
import { app, clientLeaves, listening } from './support.js';

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{"amount":1}',
  });

it('client gone, an async handler that sets its status and returns nothing (Fastify sends for it): the outcome is settled, not left in progress', async () => {
  // Fastify's wrapThenable skips reply.send for an aborted request: unless the plugin settles it from the
  // reply, the capture never sees an end and the heartbeat renews the lease for as long as the process
  // lives (every retry 409; maxExecution is off by default). The 204 is stored and replayed instead.
  const events: IdempotencyEvent[] = [];
  let runs = 0;
  const leaving = clientLeaves();
  const instance = await app({ lease: '1s', onEvent: (event) => events.push(event) }, (a) => {
    a.post('/charges', async (request, reply) => {
      runs++;
      const gone = request.headers['idempotency-key'] === 'gone-1';
      if (gone) await leaving.untilGone(request);
      // The effect happened; Fastify answers an async handler's undefined with the status set.
      reply.code(204);
      if (gone) leaving.returned();
    });
  });
  const url = await listening(instance);
  try {
    // A connected client gets the 204 Fastify sends for the handler.
    const connected = await post(url, 'here-1');
    expect(connected.status).toBe(204);
    await abandonedPost(`${url}/charges`, 'gone-1', leaving.running, '{"amount":1}');
    await leaving.handlerReturned;
    // The memory store settles at once: a settled outcome shows by now.
    const settled = events.filter((event) => event.type !== 'claim' && event.type !== 'replay');
    expect(settled.map((event) => event.type)).toEqual(['complete', 'complete']);
    const retry = await post(url, 'gone-1');
    expect(retry.status).toBe(204);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(2);
  } finally {
    await instance.close();
  }
});

it("client gone, an async handler that returns nothing: its own reason phrase is stored as on a connected client's answer", async () => {
  // Connected, Fastify sends for the handler and the capture reads the phrase off the head; gone, the
  // plugin settles the outcome from the reply, which must say the same, or the replay says
  // `201 Created` where the first answer said `201 Created Fine`.
  const leaving = clientLeaves();
  const instance = await app({ lease: '1s' }, (a) => {
    a.post('/charges', async (request, reply) => {
      const gone = request.headers['idempotency-key'] === 'gone-2';
      if (gone) await leaving.untilGone(request);
      reply.code(201);
      reply.raw.statusMessage = 'Created Fine';
      if (gone) leaving.returned();
    });
  });
  const url = await listening(instance);
  try {
    const connected = await post(url, 'here-2');
    expect(connected.statusText).toBe('Created Fine');
    expect((await post(url, 'here-2')).statusText).toBe('Created Fine');
    await abandonedPost(`${url}/charges`, 'gone-2', leaving.running, '{"amount":1}');
    await leaving.handlerReturned;
    const retry = await post(url, 'gone-2');
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.status).toBe(201);
    // Was wrong: the record settled from the reply had no reason phrase.
    expect(retry.statusText).toBe('Created Fine');
  } finally {
    await instance.close();
  }
});
