// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control), set by a
// handler whose client left: the outcome settled from what the handler left is stored without it and
// replayed. The connected case is a row of the shared scenario table (@idem/testkit describeAdapter).
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { captureWarningsEachTest } from '../../core/test/support/warnings.js';
import { abandonedPost, clientLeaves, listen } from './support.js';

const warnings = captureWarningsEachTest();
const phraseWarnings = () => warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE');

const post = (url: string, key: string) =>
  fetch(url, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{}',
    signal: AbortSignal.timeout(5_000),
  });

it('client gone, a phrase Node cannot write: the outcome is stored without it and replayed', async () => {
  const store = memoryStore();
  const leaving = clientLeaves();
  let effects = 0;
  let returned!: () => void;
  const handlerReturned = new Promise<void>((resolve) => {
    returned = resolve;
  });
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.use(async (ctx) => {
    effects += 1;
    await leaving.untilGone(ctx);
    ctx.status = 201;
    ctx.message = 'Fehler \u2717';
    ctx.body = { id: 'ch_1' };
    setImmediate(returned);
  });
  await listen(app, async (url) => {
    await abandonedPost(url, 'gone-1', leaving.running);
    await handlerReturned;
    // Was a defect: the record settled from ctx carried the phrase, the store refused it, and the key
    // was released: the retry ran the handler again.
    const retry = await post(url, 'gone-1');
    expect([retry.status, retry.statusText, retry.headers.get('idempotent-replayed')]).toEqual([
      201,
      'Created',
      'true',
    ]);
    expect(await retry.text()).toBe('{"id":"ch_1"}');
    expect(effects).toBe(1);
    expect(phraseWarnings()).toHaveLength(1);
  });
});
