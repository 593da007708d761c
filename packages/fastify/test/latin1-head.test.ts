// Heads with characters U+0080..U+00FF on Fastify replies the describeAdapter row does not write: a
// stream of strings (an object-mode stream: each chunk reaches res.write as a string), and the 503
// Fastify's own handlerTimeout answers while the handler runs on (before the fix of the capture, it
// went out in UTF-8).
// Read off a raw socket: the head leaves in Latin-1 (one byte per character), as every replay does.
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import { frameRequest, type RawAnswer, sendRaw, transactionalMemoryStore } from '@idem/testkit';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';

const request = (key: string) =>
  frameRequest(
    `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n`,
    Buffer.alloc(0),
  ).bytes;

function head(answer: RawAnswer): string {
  return answer.raw.subarray(0, answer.raw.indexOf('\r\n\r\n')).toString('latin1');
}

describe.each([false, true])('transactional: %s', (transactional) => {
  it('a stream of strings: the replay sends the head and body bytes of the first answer', async () => {
    const store = transactional ? transactionalMemoryStore() : memoryStore();
    const app = Fastify();
    await app.register(idempotency, { store, scope: () => 'tenant-1', transactional });
    let runs = 0;
    app.post('/charges', async (_request, reply) => {
      runs++;
      reply.raw.statusMessage = 'Créé ÿ';
      return reply
        .code(201)
        .header('location', '/charges/café')
        .type('text/plain; charset=utf-8')
        .send(Readable.from(['créé ', 'à ', '100 €']));
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const port = (app.server.address() as AddressInfo).port;
      const first = await sendRaw(port, request('k-1'));
      const again = await sendRaw(port, request('k-1'));
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
      expect(head(first)).toMatch(/^HTTP\/1\.1 201 Créé ÿ\r\n/);
      expect(head(first)).toMatch(/\r\nlocation: \/charges\/café(\r\n|$)/);
      expect(head(again)).toMatch(/^HTTP\/1\.1 201 Créé ÿ\r\n/);
      expect(head(again)).toMatch(/\r\nlocation: \/charges\/café(\r\n|$)/);
      expect(first.body.toString()).toBe('créé à 100 €');
      expect(again.body.toString()).toBe('créé à 100 €');
    } finally {
      await app.close();
    }
  });
});

it("handlerTimeout's 503 over a head with such characters leaves in Latin-1", async () => {
  const app = Fastify({ handlerTimeout: 50 });
  await app.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  app.addHook('onRequest', async (_request, reply) => {
    reply.header('x-region', 'Zürich');
  });
  app.post('/charges', async (_request, reply) => {
    await gate;
    return reply.code(201).send({ id: 'ch_1' });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  try {
    const port = (app.server.address() as AddressInfo).port;
    const first = await sendRaw(port, request('k-1'));
    expect(head(first)).toMatch(/^HTTP\/1\.1 503 /);
    expect(head(first)).toMatch(/\r\nx-region: Zürich(\r\n|$)/);
    expect(JSON.parse(first.body.toString()).code).toBe('FST_ERR_HANDLER_TIMEOUT');
  } finally {
    open();
    await app.close();
  }
});
