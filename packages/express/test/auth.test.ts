import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { requireRoles, requireScopes } from '@idem/guard';
import express from 'express';
import { describeAuthGlue } from '../../guard/test/support/http-scenarios.js';
import { authorize, forwardHeaders, guard, internalAuth } from '../src/auth.js';
import { idempotency } from '../src/idempotency.js';

describeAuthGlue('Express', async ({ guard: edge, shopGuard, dpopGuard, nonceGuard, verifier, hit }) => {
  const app = express();
  app.all('/protected', guard(edge), (req, res) => {
    hit('protected');
    res.json({ sub: req.auth?.sub, scope: [...(req.auth?.scope ?? [])] });
  });
  app.get('/write', guard(edge), authorize(requireScopes('orders:write')), (_req, res) => {
    hit('write');
    res.json({ ok: true });
  });
  app.get('/admin', guard(edge), authorize(requireRoles('admin')), (_req, res) => {
    hit('admin');
    res.json({ ok: true });
  });
  app.get('/forward', guard(edge), async (req, res) => {
    hit('forward');
    res.json(await forwardHeaders(req, { audience: 'orders' }));
  });
  app.get('/internal', internalAuth(verifier), (req, res) => {
    hit('internal');
    res.json({ sub: req.auth?.sub, iss: req.auth?.iss, scope: [...(req.auth?.scope ?? [])] });
  });
  app.get('/internal-write', internalAuth(verifier), authorize(requireScopes('orders:write')), (_req, res) => {
    hit('internal-write');
    res.json({ ok: true });
  });
  app.get('/authorize-only', authorize(requireScopes('orders:read')), (_req, res) => {
    hit('authorize-only');
    res.json({ ok: true });
  });
  app.all('/dpop', guard(dpopGuard), (req, res) => {
    hit('dpop');
    res.json({ sub: req.auth?.sub });
  });
  const optional = guard(shopGuard, { optional: true });
  app.all('/optional', optional, (req, res) => {
    hit('optional');
    res.json({ sub: req.auth?.sub ?? null });
  });
  app.get('/optional-read', optional, authorize(requireScopes('orders:read')), (_req, res) => {
    hit('optional-read');
    res.json({ ok: true });
  });
  let charges = 0;
  app.post('/optional-charge', optional, idempotency({ store: memoryStore() }), (req, res) => {
    hit('optional-charge');
    res.status(201).json({ sub: req.auth?.sub, n: ++charges });
  });
  const everyone = idempotency({ store: memoryStore(), scope: () => 'everyone' });
  app.post('/optional-scoped-charge', optional, everyone, (req, res) => {
    hit('optional-scoped-charge');
    res.status(201).json({ sub: req.auth?.sub ?? null, n: ++charges });
  });
  app.all('/dpop-nonce', guard(nonceGuard), (req, res) => {
    hit('dpop-nonce');
    res.json({ sub: req.auth?.sub });
  });
  app.all('/optional-dpop', guard(dpopGuard, { optional: true }), (req, res) => {
    hit('optional-dpop');
    res.json({ sub: req.auth?.sub ?? null });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
});
