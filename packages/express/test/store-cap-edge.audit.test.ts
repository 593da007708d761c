// Mutation test of the HTTP layer's check against the store's own cap (`overStoreCap`): a response
// exactly at memoryStore's `maxBytes` is one the store keeps (it refuses only a larger one), so it
// is stored and replayed, not settled in advance as too large (500 response_not_replayable).
import { memoryStore, type Store, storedResponseSize } from '@idem/core';
import express from 'express';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';
import { serve } from './support.js';

function appOn(store: Store) {
  const app = express();
  app.use(idempotency({ store, scope: () => 'tenant-1' }));
  app.post('/charges', (_req, res) => {
    res.status(201).type('text/plain').send('charged'.repeat(20));
  });
  return app;
}

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': key } });

describe('a response exactly at the store cap (memoryStore maxBytes)', () => {
  it('is stored and replayed', async () => {
    // How large this route's stored response is, measured as the cap is measured.
    const sizes: number[] = [];
    const measuring = memoryStore();
    const complete = measuring.complete.bind(measuring);
    measuring.complete = (input) => {
      sizes.push(storedResponseSize(input.response));
      return complete(input);
    };
    await serve(appOn(measuring), async (url) => {
      expect((await post(url, 'measure-1')).status).toBe(201);
    });
    const [size] = sizes;
    if (size === undefined) throw new Error('nothing was stored');

    const store = memoryStore({ maxBytes: size });
    await serve(appOn(store), async (url) => {
      const first = await post(url, 'edge-1');
      expect([first.status, await first.text()]).toEqual([201, 'charged'.repeat(20)]);
      const retry = await post(url, 'edge-1');
      expect([retry.status, await retry.text(), retry.headers.get('idempotent-replayed')]).toEqual([
        201,
        'charged'.repeat(20),
        'true',
      ]);
    });
  });
});
