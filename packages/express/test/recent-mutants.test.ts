// The Express adapter's recent changes (the anonymous-request check, advertiseExpiry with the
// policy's view of a thrown handler): behaviours that mutation testing and a critical read of
// packages/express/src/idempotency.ts and packages/core/src/http-*.ts showed no test held.
import { memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import express from 'express';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, SECRET } from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';
import { idempotency, idempotencyErrors } from '../src/idempotency.js';
import { send, serve } from './support.js';

const postKey = (url: string, key: string) => send(url, 'POST', [['idempotency-key', key]]);

describe('advertiseExpiry and a thrown handler', () => {
  // idempotencyErrors() tells the capture the handler threw before the error handler writes the
  // head, so the date is judged as the completion will be. Under 'stripe' (and 'success', or a
  // policy function reading `thrown`), the thrown handler's 500 is released; announced as kept until
  // tomorrow, a client that trusts the date would expect a replay where the retry runs again.
  it("'stripe': a thrown handler's 500 (released) announces no Idempotency-Expires", async () => {
    const app = express();
    let runs = 0;
    app.use(
      idempotency({ store: memoryStore(), scope: () => 'tenant-1', storeOutcome: 'stripe', advertiseExpiry: true }),
    );
    app.post('/charges', () => {
      runs++;
      throw new Error('boom');
    });
    app.use(idempotencyErrors());
    app.use(((_error, _req, res, _next) => {
      res.status(500).json({ error: 'internal' });
    }) as express.ErrorRequestHandler);
    await serve(app, async (url) => {
      const first = await postKey(`${url}/charges`, 'boom-1');
      expect(first.status).toBe(500);
      // Released, as 'stripe' has it: the retry runs.
      expect((await postKey(`${url}/charges`, 'boom-1')).headers['idempotent-replayed']).toBeUndefined();
      expect(runs).toBe(2);
      expect(first.headers['idempotency-expires']).toBeUndefined();
    });
  });
});

describe('an anonymous write through two stacked idempotency middlewares', () => {
  const edge = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });

  // The second instance (the route's own, without a scope) must not answer 401 to a request the
  // first (app-wide, with a scope that needs no caller) already claimed and governs: the stacked rule
  // says the second steps aside and its settings do not apply, the anonymous check included.
  it('the first middleware governs: its scope serves the write, the second steps aside', async () => {
    const app = express();
    let runs = 0;
    app.use(guard(edge, { optional: true }));
    app.use(idempotency({ store: memoryStore(), scope: () => 'everyone' }));
    app.post('/charges', idempotency({ store: memoryStore() }), (_req, res) => {
      res.status(201).json({ n: ++runs });
    });
    await serve(app, async (url) => {
      const first = await postKey(`${url}/charges`, 'anon-stacked');
      expect(first.status).toBe(201);
      expect((await postKey(`${url}/charges`, 'anon-stacked')).headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    });
  });
});
