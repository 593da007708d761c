// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control), given to
// Node's own `res.writeHead(status, phrase, headers)`: its writeHead threw after the handler made its
// effect. The phrase is dropped instead: the answer goes out with its status and the status's default
// phrase, is stored so, and its retries replay it. A phrase set as `res.statusMessage` is a row of
// the shared scenario table (@idem/testkit describeAdapter), on every framework.
import { memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { expect, it } from 'vitest';
import { captureWarningsEachTest } from '../../core/test/support/warnings.js';
import { serve } from './support.js';

const unwritable = ['Fehler \u2717', 'Created\r\nX-Injected: 1', 'Created\u0001'];

const warnings = captureWarningsEachTest();

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{}',
    signal: AbortSignal.timeout(5_000),
  });

it('a phrase Node cannot write, given to writeHead: the real status goes out with its default phrase, stored once, replayed', async () => {
  const store = memoryStore();
  let effects = 0;
  const app = express();
  app.use(express.json());
  // `success` releases the key on a 5xx: the framework's 500 for the failed write let a retry run
  // the handler a second time.
  app.use(idempotency({ store, scope: () => 'tenant-1', storeOutcome: 'success' }));
  app.post('/charges', (req, res) => {
    effects += 1;
    const phrase = unwritable[Number(req.get('idempotency-key')?.split('-')[1])] as string;
    res.writeHead(201, phrase, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: `ch_${effects}` }));
  });
  await serve(app, async (url) => {
    for (const [i] of unwritable.entries()) {
      const key = `head-${i}`;
      const before = effects;
      // Was a defect: Node's writeHead threw ERR_INVALID_CHAR, Express answered 500, and the key was released.
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
  });
  await new Promise((resolve) => setImmediate(resolve));
  expect(warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE')).toHaveLength(1);
});
