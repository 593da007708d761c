// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control): its
// writeHead throws after the handler made its effect. The phrase is dropped instead: the answer goes
// out with its status and the status's default phrase, is stored so, and its retries replay it.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore, recordId } from '@idem/core';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { app } from './support.js';

const unwritable = ['Fehler \u2717', 'Created\r\nX-Injected: 1', 'Created\u0001'];

let warnings: Error[] = [];
const onWarning = (warning: Error) => warnings.push(warning);
beforeEach(() => {
  warnings = [];
  process.on('warning', onWarning);
});
afterEach(() => {
  process.off('warning', onWarning);
});
const phraseWarnings = () =>
  warnings.filter((warning) => (warning as { code?: string }).code === 'IDEM_UNWRITABLE_REASON_PHRASE');

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{}',
    signal: AbortSignal.timeout(5_000),
  });

it("a handler's phrase Node cannot write: the real status goes out with its default phrase, stored once, replayed", async () => {
  const store = memoryStore();
  let effects = 0;
  // `success` releases the key on a 5xx: a failed write let a retry run the handler a second time.
  const instance = await app({ store, storeOutcome: 'success' }, (a) => {
    a.post('/charges', async (request, reply) => {
      effects += 1;
      reply.raw.statusMessage = unwritable[Number(String(request.headers['idempotency-key']).split('-')[1])] as string;
      return reply.code(201).send({ id: `ch_${effects}` });
    });
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
  try {
    for (const [i] of unwritable.entries()) {
      const key = `set-${i}`;
      const before = effects;
      // Was a defect: Node's writeHead threw ERR_INVALID_CHAR inside Fastify's send, the client got no
      // answer at all, and the key was released.
      const first = await post(url, key);
      expect([first.status, first.statusText, await first.text()]).toEqual([
        201,
        'Created',
        `{"id":"ch_${before + 1}"}`,
      ]);
      const retry = await post(url, key);
      expect([retry.status, retry.statusText, retry.headers.get('idempotent-replayed')]).toEqual([
        201,
        'Created',
        'true',
      ]);
      expect(await retry.text()).toBe(`{"id":"ch_${before + 1}"}`);
      expect(effects).toBe(before + 1);
      const record = await store.get(recordId('tenant-1', 'POST /charges', key));
      expect(record?.state === 'completed' && 'statusMessage' in record.response).toBe(false);
    }
  } finally {
    await instance.close();
  }
  await new Promise((resolve) => setImmediate(resolve));
  expect(phraseWarnings()).toHaveLength(1);
});

it('client gone, an async handler that returns nothing with a phrase Node cannot write: stored without it, replayed', async () => {
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  let effects = 0;
  const store = memoryStore();
  const instance = await app({ store, lease: '1s' }, (a) => {
    a.post('/charges', async (request, reply) => {
      effects += 1;
      const gone = new Promise((resolve) => request.raw.socket.once('close', resolve));
      started();
      await gone;
      reply.code(201);
      reply.raw.statusMessage = 'Fehler \u2717';
      setImmediate(returned);
    });
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(instance.server.address() as AddressInfo).port}`;
  try {
    const req = httpRequest(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'gone-1', 'content-type': 'application/json', 'content-length': '2' },
    });
    req.on('error', () => undefined);
    req.end('{}');
    await running;
    req.destroy();
    await handlerReturned;
    // Was a defect: the record settled from the reply carried the phrase, the store refused it, and
    // the key was released: the retry ran the handler again.
    const retry = await post(url, 'gone-1');
    expect([retry.status, retry.statusText, retry.headers.get('idempotent-replayed')]).toEqual([
      201,
      'Created',
      'true',
    ]);
    expect(effects).toBe(1);
    expect(phraseWarnings()).toHaveLength(1);
  } finally {
    await instance.close();
  }
});
