// A client that leaves while the handler works, on a real socket (app.inject has no connection to drop).
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { expect, it } from 'vitest';
import { app } from './support.js';

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
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  const instance = await app({ lease: '1s', onEvent: (event) => events.push(event) }, (a) => {
    a.post('/charges', async (request, reply) => {
      runs++;
      const leaving = request.headers['idempotency-key'] === 'gone-1';
      if (leaving) {
        const gone = new Promise((resolve) => request.raw.socket.once('close', resolve));
        started();
        await gone;
      }
      // The effect happened; Fastify answers an async handler's undefined with the status set.
      reply.code(204);
      if (leaving) setImmediate(returned);
    });
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
  try {
    // A connected client gets the 204 Fastify sends for the handler.
    const connected = await post(url, 'here-1');
    expect(connected.status).toBe(204);
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone-1', 'content-type': 'application/json', 'content-length': '12' },
    });
    req.on('error', () => undefined);
    req.end('{"amount":1}');
    await running;
    req.destroy();
    await handlerReturned;
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
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  const instance = await app({ lease: '1s' }, (a) => {
    a.post('/charges', async (request, reply) => {
      const leaving = request.headers['idempotency-key'] === 'gone-2';
      if (leaving) {
        const gone = new Promise((resolve) => request.raw.socket.once('close', resolve));
        started();
        await gone;
      }
      reply.code(201);
      reply.raw.statusMessage = 'Created Fine';
      if (leaving) setImmediate(returned);
    });
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
  try {
    const connected = await post(url, 'here-2');
    expect(connected.statusText).toBe('Created Fine');
    expect((await post(url, 'here-2')).statusText).toBe('Created Fine');
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone-2', 'content-type': 'application/json', 'content-length': '12' },
    });
    req.on('error', () => undefined);
    req.end('{"amount":1}');
    await running;
    req.destroy();
    await handlerReturned;
    const retry = await post(url, 'gone-2');
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.status).toBe(201);
    // Was wrong: the record settled from the reply had no reason phrase.
    expect(retry.statusText).toBe('Created Fine');
  } finally {
    await instance.close();
  }
});
