import type { AddressInfo } from 'node:net';
import { createGuard, type GuardEvent, requireScopes } from '@idem/guard';
import express from 'express';
import { SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import { authorize, guard } from '../src/index.js';

// Audit (branch audit-events): the guard's events as an on-call engineer reads them, over a real
// Express server on an ephemeral port.

const ISS = 'https://id.test';
const AUD = 'https://api.test';
const secret = 'a-test-secret-that-is-long-enough-for-hs256';

const token = (scope: string) =>
  new SignJWT({ scope })
    .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
    .setIssuer(ISS)
    .setAudience(AUD)
    .setSubject('alice')
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(new TextEncoder().encode(secret));

async function serve(run: (url: string, events: GuardEvent[], edge: ReturnType<typeof createGuard>) => Promise<void>) {
  const events: GuardEvent[] = [];
  const edge = createGuard({ audience: AUD, issuers: [{ issuer: ISS, secret }], onEvent: (e) => events.push(e) });
  const app = express();
  app.post('/orders', guard(edge), authorize(requireScopes('orders:write')), (_req, res) => {
    res.status(201).json({ ok: true });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, events, edge);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe("guard events for the refusals of DESIGN.md's HTTP table", () => {
  it('pinned: a 401 (bad token) is one rejected event with its code, and counted', async () => {
    await serve(async (url, events, edge) => {
      const response = await fetch(`${url}/orders`, { method: 'POST', headers: { authorization: 'Bearer a.b.c' } });
      expect(response.status).toBe(401);
      expect(events).toEqual([expect.objectContaining({ type: 'rejected', code: 'token_malformed' })]);
      expect(edge.stats().rejected.token_malformed).toBe(1);
    });
  });

  // DEFECT. A 403 insufficient_scope from the glue's authorize() (DESIGN.md's HTTP table: "authenticated,
  // not permitted | 403") leaves no trace in the guard's events or counters: the request shows as
  // `authenticated` and nothing else. packages/guard/src/events.ts documents `rejected` as "a request
  // was refused; `code` is the GuardErrorCode", and `insufficient_scope` is one; guard.md says
  // authorize() "answers with the guard's own challenge" (it refuses through the guard instance). An
  // on-call engineer asked "why are clients getting 403?" finds `idem.guard.requests` (the
  // operations.md recipe) showing only successes, and guard.stats().rejected empty.
  // Expected: one `rejected` event with code `insufficient_scope` (and the counter) per 403.
  it('a 403 insufficient_scope from authorize() is a rejected event with its code, and counted', async () => {
    await serve(async (url, events, edge) => {
      const response = await fetch(`${url}/orders`, {
        method: 'POST',
        headers: { authorization: `Bearer ${await token('orders:read')}` },
      });
      expect(response.status).toBe(403);
      expect(response.headers.get('www-authenticate')).toContain('insufficient_scope');
      expect(events.map((e) => e.type)).toEqual(['authenticated', 'rejected']);
      expect(events[1]).toMatchObject({ type: 'rejected', code: 'insufficient_scope' });
      expect(edge.stats().rejected.insufficient_scope).toBe(1);
    });
  });
});
