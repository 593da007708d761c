// Audit (branch audit-atrest): what the store keeps of a server-sent events response. The Koa guide
// says server-sent events are never stored and their key is released; the adapter table checks it
// for a feed written as a stream.
import { type IdempotencyEvent, memoryStore, recordId } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { listen } from './support.js';

// Was wrong: Koa answers a string body with one res.end(), its head set by setHeader and never written
// before: capturedEnd saw no status yet, so the live-feed check (onHead) had not run, and the feed was
// stored as an outcome for the whole retention; a retry got its old events replayed.
it('server-sent events given as a string body are served and never stored', async () => {
  const store = memoryStore();
  const events: IdempotencyEvent[] = [];
  let runs = 0;
  const app = new Koa();
  app.use(idempotency({ store, scope: () => 'tenant-1', onEvent: (event) => events.push(event) }));
  app.use((ctx) => {
    ctx.type = 'text/event-stream';
    ctx.body = `data: ${++runs}\n\n`;
  });
  await listen(app, async (url) => {
    const post = () => fetch(`${url}/events`, { method: 'POST', headers: { 'idempotency-key': 'sse-1' } });
    const first = await post();
    expect(first.status).toBe(200);
    expect(await first.text()).toBe('data: 1\n\n');
    expect(store.get(recordId('tenant-1', 'POST /events', 'sse-1'))).toBeUndefined();
    expect(events.find((event) => event.type === 'response-not-stored')).toMatchObject({ reason: 'event-stream' });
    const again = await post();
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(await again.text()).toBe('data: 2\n\n');
  });
});
