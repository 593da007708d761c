// A not-found middleware that answers with writeHead, in transactional mode: not stored, as in the
// default mode (the held head must set res.statusCode, which the adapter reads to tell "no route").
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency } from '@idem/express';
import { transactionalMemoryStore } from '@idem/testkit';
import express from 'express';
import { describe, expect, it } from 'vitest';

describe('a not-found middleware that answers with writeHead', () => {
  it('is not stored, and the key is released, in transactional mode as in the default one', async () => {
    for (const transactional of [false, true]) {
      const events: IdempotencyEvent[] = [];
      const app = express();
      app.use(
        idempotency({
          store: transactionalMemoryStore(),
          scope: () => 'caller',
          transactional,
          onEvent: (event) => events.push(event),
        }),
      );
      app.post('/charges', (_req, res) => {
        res.status(201).json({ id: 'ch_1' });
      });
      let answered = 0;
      app.use((_req, res) => {
        answered++;
        res.writeHead(404, { 'content-type': 'text/plain' }).end('no such route');
      });
      const server = app.listen(0, '127.0.0.1');
      await new Promise<void>((resolve) => server.once('listening', () => resolve()));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/refunds`;
      try {
        for (let i = 0; i < 2; i++) {
          const answer = await fetch(url, { method: 'POST', headers: { 'idempotency-key': `nf-${transactional}` } });
          expect(answer.status).toBe(404);
          expect(answer.headers.get('idempotent-replayed')).toBeNull();
          expect(await answer.text()).toBe('no such route');
        }
        // The retry ran again: a deploy that adds the route must not find a stored 404.
        expect(answered).toBe(2);
        expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([
          { reason: 'no-route', status: 404 },
          { reason: 'no-route', status: 404 },
        ]);
      } finally {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    }
  });
});
