// Transactional (held) mode: a client that leaves while the handler works, then the handler pipes
// its answer. In held mode every write is kept until the outcome is stored, so the pipe never
// stalls on the closed response and the answer is known in full.
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency } from '@idem/express';
import { transactionalMemoryStore } from '@idem/testkit';
import express from 'express';
import { expect, it } from 'vitest';
import { abandonedPost } from '../../core/test/support/client-gone.js';

async function goneThenAnswer(key: string, pipe: boolean) {
  let runs = 0;
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  // The first run's key settled: its outcome stored (complete) or its key given back (release). The
  // retry goes out only then; sent earlier it would meet the key in progress.
  let settled!: () => void;
  const done = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const onEvent = (event: IdempotencyEvent) => {
    if (event.type === 'complete' || event.type === 'release') settled();
  };
  const app = express();
  app.use(idempotency({ store: transactionalMemoryStore(), scope: () => 'caller', transactional: true, onEvent }));
  app.post('/exports', async (req, res) => {
    runs++;
    if (runs > 1) {
      // A retry that runs again (it should find the stored answer) is answered at once.
      res.status(201).type('text/csv').end('a,b\n1,2\n');
      return;
    }
    const gone = new Promise((resolve) => req.socket.once('close', resolve));
    started();
    await gone;
    res.status(201).type('text/csv');
    if (pipe) Readable.from(['a,b\n', '1,2\n']).pipe(res);
    else res.end('a,b\n1,2\n');
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    await abandonedPost(`${url}/exports`, key, running);
    await done;
    const retry = await fetch(`${url}/exports`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: '{}',
      signal: AbortSignal.timeout(3000),
    });
    return { runs, status: retry.status, body: await retry.text(), replayed: retry.headers.get('idempotent-replayed') };
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

it('held mode, client gone, the handler ends its answer itself: the answer is stored and replayed', async () => {
  expect(await goneThenAnswer('held-end', false)).toMatchObject({ runs: 1, status: 201, body: 'a,b\n1,2\n' });
});

it('held mode, client gone, the handler pipes its answer: the answer is stored and replayed, as when it ends it itself', async () => {
  // Was a defect: pipedIntoClosed (packages/core/src/http-capture.ts) abandons any response piped after its client left as a stream cut short, but in held mode the capture keeps every write (the pipe never stalls) and the answer would be known in full; instead the transaction is rolled back and the key released, so the retry runs the handler again.
  expect(await goneThenAnswer('held-pipe', true)).toMatchObject({ runs: 1, status: 201, body: 'a,b\n1,2\n' });
});
