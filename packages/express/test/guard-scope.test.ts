import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { guard, idempotency } from '@idem/express';
import express from 'express';
import { SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';

// The default scope end to end: the real guard verifies a token and sets req.auth, and the
// idempotency middleware scopes keys by its `iss` and `sub` with no `scope` option at all.
const secret = new TextEncoder().encode('a-test-secret-of-at-least-32-bytes!!');
const issuer = 'https://id.example';
const audience = 'https://api.example';

const token = (sub: string) =>
  new SignJWT({ scope: 'charges:write' })
    .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setAudience(audience)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(secret);

describe('@idem/express behind the guard', () => {
  it('scopes keys by the verified principal: one caller replays, another runs on its own', async () => {
    const app = express();
    let runs = 0;
    app.post(
      '/charges',
      guard({ audience, issuers: [{ issuer, secret }] }),
      idempotency({ store: memoryStore() }),
      express.json(),
      (req, res) => {
        runs++;
        res.status(201).json({ run: runs, by: req.auth?.sub });
      },
    );
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`;
    const post = async (sub: string | undefined) =>
      fetch(url, {
        method: 'POST',
        headers: {
          'idempotency-key': 'shared-key',
          'content-type': 'application/json',
          ...(sub ? { authorization: `Bearer ${await token(sub)}` } : {}),
        },
        body: '{"amount":1}',
      });
    try {
      const alice = await post('alice');
      expect(alice.status).toBe(201);
      expect(await alice.json()).toEqual({ run: 1, by: 'alice' });
      const aliceAgain = await post('alice');
      expect(aliceAgain.headers.get('idempotent-replayed')).toBe('true');
      expect(await aliceAgain.json()).toEqual({ run: 1, by: 'alice' });
      const bob = await post('bob');
      expect(bob.headers.get('idempotent-replayed')).toBeNull();
      expect(await bob.json()).toEqual({ run: 2, by: 'bob' });
      // No token: the guard answers 401 before any key is claimed.
      expect((await post(undefined)).status).toBe(401);
      expect(runs).toBe(2);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
