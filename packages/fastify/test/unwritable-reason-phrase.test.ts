// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control), set by a
// handler whose client left: the outcome settled from what the handler left is stored without it and
// replayed. The connected case is a row of the shared scenario table (@idem/testkit describeAdapter).
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { expect, it } from 'vitest';
import { captureWarningsEachTest } from '../../core/test/support/warnings.js';
import { app } from './support.js';

const warnings = captureWarningsEachTest();
const phraseWarnings = () => warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE');

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{}',
    signal: AbortSignal.timeout(5_000),
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
