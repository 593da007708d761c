// Transactional mode holds the response until the commit. Two ends the plain mode already handles
// went wrong there: a response framed by its Content-Length whose handler wrote every declared byte
// and never called end() (the client has the whole answer: plain mode settles it at the last byte)
// was held for ever, its transaction open; and an end() after the response had ended (a harmless
// no-op on Node) reached Node while the answer was still held, so the client was sent an empty
// answer of whatever status the response had while the real one was committed and replayed.
import { idempotency } from '@idem/express';
import { transactionalMemoryStore } from '@idem/testkit';
import express from 'express';
import { expect, it } from 'vitest';
import { send, serve } from './support.js';

it('held: a handler that writes every declared byte and never ends gets its answer out, and it replays', async () => {
  const app = express();
  let runs = 0;
  app.use(idempotency({ store: transactionalMemoryStore(), scope: () => 'caller', transactional: true }));
  app.post('/x', (_req, res) => {
    runs++;
    res.writeHead(201, { 'content-length': '2', 'content-type': 'text/plain' });
    res.write('ok');
  });
  await serve(app, async (url) => {
    const first = await send(`${url}/x`, 'POST', [['idempotency-key', 'framed-1']]);
    expect([first.status, first.body]).toEqual([201, 'ok']);
    const again = await send(`${url}/x`, 'POST', [['idempotency-key', 'framed-1']]);
    expect([again.status, again.body, again.headers['idempotent-replayed']]).toEqual([201, 'ok', 'true']);
    expect(runs).toBe(1);
  });
}, 10_000);

it('held: an end() after the response ended changes nothing the client gets: the answer is what was committed', async () => {
  const app = express();
  app.use(idempotency({ store: transactionalMemoryStore(), scope: () => 'caller', transactional: true }));
  app.post('/x', (_req, res) => {
    res.status(201).json({ id: 'ch_1' });
    res.end();
  });
  await serve(app, async (url) => {
    const first = await send(`${url}/x`, 'POST', [['idempotency-key', 'twice-1']]);
    expect([first.status, first.body]).toEqual([201, '{"id":"ch_1"}']);
    const again = await send(`${url}/x`, 'POST', [['idempotency-key', 'twice-1']]);
    expect([again.status, again.body]).toEqual([201, '{"id":"ch_1"}']);
  });
});
