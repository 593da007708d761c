// Audit of docs/operations.md's "Changing the configuration of a live service" as a newcomer reads
// it: a claim of its table checked against two versions of an Express app sharing one store. (The
// other rows are run on three frameworks by packages/testkit/test/rolling-config.audit.int.test.ts.)
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');

async function listen(app: express.Express): Promise<{ url: string; close(): Promise<void> }> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('docs/operations.md, Changing the configuration of a live service', () => {
  // The row that sends a retry elsewhere listed "Express or Koa mounted app-wide instead of per route
  // (or the reverse)" without a condition. Was wrong for a route without parameters: app-wide, the
  // operation is the method and the path as the router matches it; per route, the method and the
  // template; for `/charges` they are the same operation, so the retry finds its record and is
  // replayed. Only where the path is not the template (`/charges/:id`) does it run again (pinned on
  // three frameworks by the rolling-config audit). An operator planning the move as two deploys for
  // every route did so for nothing.
  it('app-wide to per route on a route without parameters: the retry replays, nothing runs twice', async () => {
    const store = memoryStore();
    let runs = 0;
    const charge: express.RequestHandler = (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_${runs}` });
    };
    const old = express();
    old.use(idempotency({ store, scope: () => 'tenant-1' }));
    old.post('/charges', charge);
    const next = express();
    next.post('/charges', idempotency({ store, scope: () => 'tenant-1' }), charge);
    const before = await listen(old);
    const after = await listen(next);
    try {
      const init = { method: 'POST', headers: { 'idempotency-key': '"k-1"' } };
      const first = await fetch(`${before.url}/charges`, init);
      const retry = await fetch(`${after.url}/charges`, init);
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.text()).toBe(await first.text());
      expect(runs).toBe(1);
    } finally {
      await before.close();
      await after.close();
    }
    const row = page.split('\n').find((line) => line.includes('Express or Koa mounted app-wide instead of per route'));
    expect(row).toMatch(/app-wide instead of per route \(or the reverse\) on a route with parameters/);
  });
});
