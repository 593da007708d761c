// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control), set by a
// handler whose client left: the outcome settled from what the handler left is stored without it and
// replayed. The connected case is a row of the shared scenario table (@idem/testkit describeAdapter).
import { memoryStore } from '@idem/core';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';
import { captureWarningsEachTest } from '../../core/test/support/warnings.js';
import { app, clientLeaves, listening } from './support.js';

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
  const leaving = clientLeaves();
  let effects = 0;
  const store = memoryStore();
  const instance = await app({ store, lease: '1s' }, (a) => {
    a.post('/charges', async (request, reply) => {
      effects += 1;
      await leaving.untilGone(request);
      reply.code(201);
      reply.raw.statusMessage = 'Fehler \u2717';
      leaving.returned();
    });
  });
  const url = await listening(instance);
  try {
    await abandonedPost(`${url}/charges`, 'gone-1', leaving.running);
    await leaving.handlerReturned;
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
