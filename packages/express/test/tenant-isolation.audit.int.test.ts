// Namespace isolation end to end: the real guard verifies tokens and sets req.auth, idempotency()
// scopes keys by the verified principal (no `scope` option), over memory, Redis and PostgreSQL.
// Callers that differ in any way the token proves (issuer, subject, and with perClient the client)
// never share a record, whatever characters their identities hold, and one caller's key in flight
// never blocks another caller who chose the same key.

import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore, principalScope, type Store } from '@idem/core';
import { guard, idempotency, internalAuth } from '@idem/express';
import { createGuard, createInternalTokenIssuer, defaultInternalTokenHeader } from '@idem/guard';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { databaseUrl, postgresAnswers, redisAnswers, redisUrl, serviceAvailable } from '@idem/testkit';

import express from 'express';
import { Redis } from 'ioredis';
import { SignJWT } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';

const audience = 'https://api.example';
const issuers = {
  a: { issuer: 'https://a.example', secret: new TextEncoder().encode('issuer-a-secret-of-at-least-32-bytes') },
  b: { issuer: 'https://b.example', secret: new TextEncoder().encode('issuer-b-secret-of-at-least-32-bytes') },
};

const token = (from: keyof typeof issuers, sub: string, claims: Record<string, unknown> = {}) =>
  new SignJWT({ scope: 'charges:write', ...claims })
    .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
    .setIssuer(issuers[from].issuer)
    .setAudience(audience)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(issuers[from].secret);

interface Served {
  url: string;
  runs: () => number;
  close: () => Promise<void>;
}

// An app with the guard in front and one idempotent route that counts its runs and says who ran it.
async function serve(store: Store, options: { perClient?: boolean; gate?: Promise<void> } = {}): Promise<Served> {
  const app = express();
  let runs = 0;
  app.use(guard({ audience, issuers: [issuers.a, issuers.b] }));
  app.post(
    '/charges',
    idempotency({
      store,
      storeTimeout: '15s',
      ...(options.perClient ? { scope: (req) => principalScope(req.auth, { perClient: true }) } : {}),
    }),
    express.json(),
    async (req, res) => {
      runs++;
      const run = runs;
      // Only issuer a's 'slow' waits: the same subject from issuer b is another caller.
      if (options.gate && req.auth?.sub === 'slow' && req.auth.iss === issuers.a.issuer) await options.gate;
      res.status(201).json({ run, iss: req.auth?.iss, sub: req.auth?.sub, client: req.auth?.clientId ?? null });
    },
  );
  return listen(app, () => runs);
}

async function listen(app: express.Express, runs: () => number): Promise<Served> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    runs,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const charge = async (url: string, bearer: string, key: string, body = '{"amount":1}') => {
  const answer = await fetch(`${url}/charges`, {
    method: 'POST',
    headers: { authorization: `Bearer ${bearer}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body,
  });
  return { status: answer.status, replayed: answer.headers.get('idempotent-replayed'), body: await answer.json() };
};

// Pairs of subjects that a naive `${iss}:${sub}` or `${scope}|${key}` join, a U+FFFD replacement or a
// Unicode normalisation would make one. A NUL-terminated reading (`n\u0000m` as `n`) cannot arise: the
// guard refuses a subject holding a control character (claim_invalid), checked in the test below.
const lookAlikes: [string, string][] = [
  ['a:b', 'a'],
  ['x|y', 'x'],
  ['u/v', 'u'],
  ['\u00e9', 'e\u0301'],
  ['\ud800', '\ud801'],
  ['\ud800', '\ufffd'],
  ['Alice', 'alice'],
  ['alice ', 'alice'],
];

const redisRun = `audit-tenant:${randomBytes(4).toString('hex')}:`;
const table = `idem_audit_tenant_${randomBytes(4).toString('hex')}`;
let redis: Redis | undefined;
let pool: pg.Pool | undefined;
let scenario = 0;

const withRedis = serviceAvailable(`Redis at ${redisUrl()}`, await redisAnswers(redisUrl()), 'the Redis runs');
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl()}`,
  await postgresAnswers(databaseUrl()),
  'the PostgreSQL runs',
);

beforeAll(async () => {
  if (withRedis) redis = new Redis(redisUrl());
  if (withPostgres) {
    pool = new pg.Pool({ connectionString: databaseUrl(), max: 4 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
  }
});

afterAll(async () => {
  if (redis) {
    await deleteKeys(redis, redisRun);
    await redis.quit();
  }
  if (pool) {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  }
});

const stores: [string, boolean, () => Store][] = [
  ['memory', true, () => memoryStore()],
  ['Redis', withRedis, () => redisStore({ client: redis as Redis, prefix: `${redisRun}${++scenario}:` })],
  // One table for every scenario: the records of one scenario must not be found by another anyway.
  ['PostgreSQL', withPostgres, () => postgresStore({ client: pool as pg.Pool, table })],
];

for (const [name, available, makeStore] of stores) {
  describe.runIf(available)(`tenant isolation over ${name}`, () => {
    it('two issuers whose tokens carry the same sub never share a record', async () => {
      const served = await serve(makeStore());
      try {
        const key = `same-sub-${scenario}-${randomBytes(4).toString('hex')}`;
        const fromA = await charge(served.url, await token('a', 'alice'), key);
        const fromB = await charge(served.url, await token('b', 'alice'), key);
        expect(fromA).toMatchObject({ status: 201, replayed: null, body: { run: 1, iss: issuers.a.issuer } });
        expect(fromB).toMatchObject({ status: 201, replayed: null, body: { run: 2, iss: issuers.b.issuer } });
        // Each still replays its own.
        expect(await charge(served.url, await token('b', 'alice'), key)).toMatchObject({
          replayed: 'true',
          body: { run: 2, iss: issuers.b.issuer },
        });
        expect(await charge(served.url, await token('a', 'alice'), key)).toMatchObject({
          replayed: 'true',
          body: { run: 1, iss: issuers.a.issuer },
        });
        expect(served.runs()).toBe(2);
      } finally {
        await served.close();
      }
    });

    it('subjects with separators, lone surrogates, case and normalisation variants stay apart; NUL or blank ones never reach the store', async () => {
      const served = await serve(makeStore());
      try {
        const key = `odd-${randomBytes(4).toString('hex')}`;
        let expected = 0;
        for (const [pair, [first, second]] of lookAlikes.entries()) {
          for (const sub of [first, second]) {
            expected++;
            const answer = await charge(served.url, await token('a', sub), `${key}-${pair}`);
            expect(answer, JSON.stringify(sub)).toMatchObject({ status: 201, replayed: null, body: { run: expected } });
          }
          // The first one's retry is still its own.
          const again = await charge(served.url, await token('a', first), `${key}-${pair}`);
          expect(again, JSON.stringify(first)).toMatchObject({ replayed: 'true', body: { sub: first } });
        }
        for (const sub of ['n\u0000m', ' ']) {
          const refused = await charge(served.url, await token('a', sub), `${key}-refused`);
          expect(refused, JSON.stringify(sub)).toMatchObject({ status: 401, body: { code: 'claim_invalid' } });
        }
        expect(served.runs()).toBe(expected);
      } finally {
        await served.close();
      }
    });

    it('a subject as long as the token limit allows is stored under a fixed-size id and replays', async () => {
      const served = await serve(makeStore());
      try {
        const long = `${'s'.repeat(5000)}:${randomBytes(4).toString('hex')}`;
        const key = 'k'.repeat(255);
        const first = await charge(served.url, await token('a', long), key);
        expect(first).toMatchObject({ status: 201, replayed: null });
        expect(await charge(served.url, await token('a', long), key)).toMatchObject({
          status: 201,
          replayed: 'true',
          body: { run: 1 },
        });
        // One character less is another caller.
        expect(await charge(served.url, await token('a', long.slice(1)), key)).toMatchObject({
          replayed: null,
          body: { run: 2 },
        });
      } finally {
        await served.close();
      }
    });

    it('keys that differ only in case are two keys; quoted, bare and padded spellings are one', async () => {
      const served = await serve(makeStore());
      try {
        const key = `Case-${randomBytes(4).toString('hex')}`;
        const bearer = await token('a', 'alice');
        expect(await charge(served.url, bearer, key)).toMatchObject({ replayed: null, body: { run: 1 } });
        expect(await charge(served.url, bearer, key.toLowerCase())).toMatchObject({ replayed: null, body: { run: 2 } });
        for (const spelling of [`"${key}"`, `  ${key}\t`, `"${key}";p=1`]) {
          expect(await charge(served.url, bearer, spelling), spelling).toMatchObject({
            replayed: 'true',
            body: { run: 1 },
          });
        }
        expect(served.runs()).toBe(2);
      } finally {
        await served.close();
      }
    });

    it("one caller's key in flight never blocks another caller who chose the same key", async () => {
      let release!: () => void;
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      const served = await serve(makeStore(), { gate });
      try {
        const key = `in-flight-${randomBytes(4).toString('hex')}`;
        const slow = charge(served.url, await token('a', 'slow'), key);
        // Wait (without a timer) until the slow caller's handler runs, holding its claim.
        while (served.runs() === 0) await new Promise((resolve) => setImmediate(resolve));
        // The same caller is told to wait; another caller runs at once.
        expect((await charge(served.url, await token('a', 'slow'), key)).status).toBe(409);
        expect(await charge(served.url, await token('a', 'fast'), key)).toMatchObject({
          status: 201,
          replayed: null,
          body: { sub: 'fast' },
        });
        expect(await charge(served.url, await token('b', 'slow'), key)).toMatchObject({
          status: 201,
          body: { sub: 'slow', iss: issuers.b.issuer },
        });
        release();
        expect(await slow).toMatchObject({ status: 201, body: { run: 1, sub: 'slow' } });
      } finally {
        release();
        await served.close();
      }
    });

    it('by default every client of one user shares the keys; with perClient each client has its own', async () => {
      const shared = await serve(makeStore());
      const apart = await serve(makeStore(), { perClient: true });
      try {
        const key = `clients-${randomBytes(4).toString('hex')}`;
        for (const served of [shared, apart]) {
          await charge(served.url, await token('a', 'alice', { client_id: 'photo-app' }), key);
          await charge(served.url, await token('a', 'alice', { client_id: 'third-party' }), key);
        }
        expect(shared.runs()).toBe(1);
        expect(apart.runs()).toBe(2);
        // With perClient, a token without a client id has no scope: refused, nothing runs.
        const noClient = await charge(apart.url, await token('a', 'alice'), key);
        expect(noClient).toMatchObject({ status: 500, body: { code: 'scope_missing' } });
        expect(apart.runs()).toBe(2);
      } finally {
        await shared.close();
        await apart.close();
      }
    });
  });
}

describe('tenant isolation behind the gateway (internal tokens)', () => {
  it('the API scopes by the original issuer and subject, so two issuers with the same sub stay apart', async () => {
    const edge = createGuard({ audience, issuers: [issuers.a, issuers.b] });
    const internal = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    const api = express();
    let runs = 0;
    api.use(internalAuth({ issuer: 'https://gateway.example', audience: 'charges-api', jwks: internal.jwks() }));
    api.post('/charges', idempotency({ store: memoryStore() }), express.json(), (req, res) => {
      runs++;
      res.status(201).json({ run: runs, iss: req.auth?.iss, sub: req.auth?.sub });
    });
    const served = await listen(api, () => runs);
    // What the gateway does: verify the edge token, mint an internal token for the API.
    const through = async (from: keyof typeof issuers, sub: string, key: string) => {
      const verified = await edge.verify(await token(from, sub));
      if (!verified.ok) throw new Error(`edge token refused: ${verified.error.code}`);
      const internalToken = await internal.mint(verified.principal, { audience: 'charges-api' });
      const answer = await fetch(`${served.url}/charges`, {
        method: 'POST',
        headers: {
          [defaultInternalTokenHeader]: internalToken,
          'idempotency-key': key,
          'content-type': 'application/json',
        },
        body: '{"amount":1}',
      });
      return { status: answer.status, replayed: answer.headers.get('idempotent-replayed'), body: await answer.json() };
    };
    try {
      expect(await through('a', 'alice', 'gw-1')).toMatchObject({
        status: 201,
        body: { run: 1, iss: issuers.a.issuer },
      });
      expect(await through('b', 'alice', 'gw-1')).toMatchObject({
        status: 201,
        body: { run: 2, iss: issuers.b.issuer },
      });
      expect(await through('a', 'alice', 'gw-1')).toMatchObject({ replayed: 'true', body: { run: 1 } });
      expect(runs).toBe(2);
    } finally {
      await served.close();
    }
  });
});
