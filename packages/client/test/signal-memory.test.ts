import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { createClient, type FetchFunction } from '@idem/client';
import { expect, it } from 'vitest';

// Was a defect: every attempt made `AbortSignal.any([callerSignal, own])`, and Node 22 (22.23 at
// least; the engines floor is 22.12) keeps about 170 bytes on the source signal for each one, for
// good. A service passing one long-lived signal (its shutdown signal, say) to every request grew
// without bound. The attempt now runs under its own signal, to which the caller's abort is
// forwarded while it runs; `AbortSignal.any` is left to `parse: 'none'`, whose body outlives it.
// (CI runs the unit tests on Node 22 as well, where this fails on the old code; Node 24 does not leak.)
it('a long-lived caller signal does not grow with the requests made under it', async () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const fetch: FetchFunction = async () =>
    new Response('{"ok":true}', { status: 200, headers: { 'content-type': 'application/json' } });
  const client = createClient({ baseUrl: 'https://api.example.test/', fetch });
  const shutdown = new AbortController();
  const run = async (count: number) => {
    for (let i = 0; i < count; i++) {
      const result = await client.get('/stock', { signal: shutdown.signal });
      if (result.status !== 200) throw new Error(`unexpected ${result.status}`);
    }
  };
  await run(2_000);
  gc();
  await new Promise((resolve) => setTimeout(resolve, 20));
  gc();
  const before = process.memoryUsage().heapUsed;
  const count = 30_000;
  await run(count);
  gc();
  await new Promise((resolve) => setTimeout(resolve, 20));
  gc();
  const perRequest = (process.memoryUsage().heapUsed - before) / count;
  // About 170 bytes a request on Node 22 before the change; nothing kept now.
  expect(perRequest).toBeLessThan(50);
});
