// Mutation test of the plugin's route wrapper (watchReturn): a handler that hijacked its reply and
// returned nothing still writes the response itself, so what Fastify would send for it (its status,
// no body) is no outcome, even when the client leaves before that response's head.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { expect, it } from 'vitest';
import { app } from './support.js';

it('a hijacked reply whose handler returned nothing: a client gone before the head leaves the outcome to the handler', async () => {
  const events: IdempotencyEvent[] = [];
  let runs = 0;
  let closed!: () => void;
  const clientClosed = new Promise<void>((resolve) => {
    closed = resolve;
  });
  let wrote!: () => void;
  const handlerWrote = new Promise<void>((resolve) => {
    wrote = resolve;
  });
  // The promise the handler returned: the plugin's wrapper took its `then` first, so once it settles
  // for the test, the wrapper has seen the handler return undefined.
  let returned: Promise<void> | undefined;
  const instance = await app({ onEvent: (event) => events.push(event) }, (a) => {
    a.post('/charges', (request, reply) => {
      returned = (async () => {
        runs++;
        reply.hijack();
        // The handler answers later, on its own: after its client left, it ends the response anyway.
        request.raw.socket.once('close', () => {
          closed();
          setImmediate(() => {
            reply.raw.writeHead(201, { 'content-type': 'text/plain' });
            reply.raw.end('charged');
            wrote();
          });
        });
      })();
      return returned;
    });
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const { port } = instance.server.address() as AddressInfo;
  try {
    const req = httpRequest({
      host: '127.0.0.1',
      port,
      path: '/charges',
      method: 'POST',
      headers: { 'idempotency-key': 'hijacked-1', 'content-type': 'application/json', 'content-length': '12' },
    });
    req.on('error', () => undefined);
    req.end('{"amount":1}');
    await expect.poll(() => runs).toBe(1);
    // The handler's promise settled (it returned undefined, the reply hijacked) before leaving.
    await returned;
    req.destroy();
    await clientClosed;
    await handlerWrote;
    await expect.poll(() => events.some((event) => event.type === 'complete' || event.type === 'release')).toBe(true);
    const retry = await fetch(`http://127.0.0.1:${port}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'hijacked-1', 'content-type': 'application/json' },
      body: '{"amount":1}',
    });
    expect([retry.status, await retry.text(), retry.headers.get('idempotent-replayed')]).toEqual([
      201,
      'charged',
      'true',
    ]);
    expect(runs).toBe(1);
  } finally {
    await instance.close();
  }
});
