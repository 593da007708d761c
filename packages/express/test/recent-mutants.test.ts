// The Express adapter's recent changes (the anonymous-request check, advertiseExpiry with the
// policy's view of a thrown handler): behaviours that mutation testing and a critical read of
// packages/express/src/idempotency.ts and packages/core/src/http.ts showed no test held.
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
  // Defect: the date is computed for the status alone, as if the handler had not thrown, though
  // idempotencyErrors() has told the capture it threw before the error handler writes the head.
  // Under 'stripe' (and 'success', or a policy function reading `thrown`), the thrown handler's 500
  // is released, yet announced as kept until tomorrow: a client that trusts the date expects a
  // replay, and the retry runs the operation again.
  it.fails("'stripe': a thrown handler's 500 (released) announces no Idempotency-Expires", async () => {
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

  // Defect: the anonymous check runs before begin() learns the middleware is stacked, so the second
  // instance (the route's own, without a scope) answers 401 to a request the first (app-wide, with a
  // scope that needs no caller) already claimed and governs. The stacked rule says the second steps
  // aside and its settings do not apply; here they refuse the write.
  it.fails('the first middleware governs: its scope serves the write, the second steps aside', async () => {
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
