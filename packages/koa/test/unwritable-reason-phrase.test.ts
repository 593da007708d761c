// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control): its
// writeHead throws after the handler made its effect. The phrase is dropped instead: the answer goes
// out with its status and the status's default phrase, is stored so, and its retries replay it.
import { memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { abandonedPost, clientLeaves, listen } from './support.js';

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
  fetch(url, {
    method: 'POST',
    headers: { 'idempotency-key': key, 'content-type': 'application/json' },
    body: '{}',
    signal: AbortSignal.timeout(5_000),
  });

it("a handler's phrase Node cannot write: the real status goes out with its default phrase, stored once, replayed", async () => {
  const store = memoryStore();
  let effects = 0;
  const app = new Koa();
  // `success` releases the key on a 5xx: Koa's 500 for the failed write let a retry run the handler
  // a second time.
  app.use(idempotency({ store, scope: () => 'tenant-1', storeOutcome: 'success' }));
  app.use(async (ctx) => {
    effects += 1;
    ctx.status = 201;
    ctx.message = unwritable[Number(ctx.get('idempotency-key').split('-')[1])] as string;
    ctx.body = { id: `ch_${effects}` };
  });
  await listen(app, async (url) => {
    for (const [i] of unwritable.entries()) {
      const key = `set-${i}`;
      const before = effects;
      // Was a defect: Node's writeHead threw ERR_INVALID_CHAR, Koa answered 500, and the key was released.
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
      const record = await store.get(recordId('tenant-1', 'POST /', key));
      expect(record?.state === 'completed' && 'statusMessage' in record.response).toBe(false);
    }
  });
  await new Promise((resolve) => setImmediate(resolve));
  expect(phraseWarnings()).toHaveLength(1);
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
