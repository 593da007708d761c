// Audit of docs/operations.md against behaviour, section by section, for the claims no other test
// pins (the live-configuration table, investigating one key, the proxies, the rotations and the
// OpenTelemetry recipe have audits of their own: see the page). Real Redis and PostgreSQL, real
// servers on port 0, injected clocks; a claim found false has its test written first.
import { generateKeyPairSync, type KeyObject, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createIdempotency, type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  type Guard,
  type GuardEvent,
} from '@idem/guard';
import { migrate, type PostgresStore, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { createTcpProxy, postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { createOutbox } from '@idem/webhooks';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { SignJWT } from 'jose';
import Koa from 'koa';
import pg from 'pg';
import ts from 'typescript';
import { afterAll, describe, expect, it } from 'vitest';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');
// The page's prose with its line breaks folded, for claims that wrap.
const prose = page.replace(/\s+/g, ' ');
const says = (text: string, where = prose) =>
  expect(where.includes(text), `docs/operations.md says: ${text}`).toBe(true);
const section = (heading: string): string => {
  const start = page.indexOf(`\n## ${heading}\n`);
  if (start < 0) throw new Error(`docs/operations.md has no section ${heading}`);
  const end = page.indexOf('\n## ', start + 4);
  return page.slice(start, end < 0 ? undefined : end);
};
// The first ```ts block of a section, as the page has it.
const tsBlock = (heading: string): string => {
  const found = /^```ts\n([\s\S]*?)^```\s*$/m.exec(section(heading))?.[1];
  if (found === undefined) throw new Error(`no ts block under ${heading}`);
  return found;
};

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withRedis = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the operations page on Redis',
);
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the operations page on PostgreSQL',
);

describe.skipIf(!withPostgres)('Purge jobs', () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
  const tables: string[] = [];
  afterAll(async () => {
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // The page's block, compiled and run as it is: its loop from two instances at once, and the timer
  // it sets. "deletes at most one batch per call, skips rows another session holds, and returns how
  // many it deleted, so a loop drains a backlog"; "Running it from several instances at once is safe."
  it('the purge loop of the page drains a backlog of expired rows, from two instances at once, and keeps live rows', async () => {
    const table = `audit_ops_purge_${randomBytes(4).toString('hex')}`;
    tables.push(table);
    await migrate(pool, { table });
    // 2,505 completed rows whose retention ended a minute ago, and one still kept.
    await pool.query(
      `INSERT INTO "${table}" (id, state, token, fingerprint, status, headers, body, expires_at)
       SELECT 'c' || g, 'completed', 't', 'f', 201, '{}'::jsonb, ''::bytea, clock_timestamp() - interval '1 minute'
         FROM generate_series(1, 2505) g`,
    );
    await pool.query(
      `INSERT INTO "${table}" (id, state, token, fingerprint, status, headers, body, expires_at)
       VALUES ('live', 'completed', 't', 'f', 201, '{}'::jsonb, ''::bytea, clock_timestamp() + interval '1 hour')`,
    );
    const js = ts
      .transpileModule(tsBlock('Purge jobs'), {
        compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, verbatimModuleSyntax: true },
      })
      .outputText.replace(/^export \{\};$/m, '');
    const timers: Array<{ ms: number; unref: boolean; run: () => void }> = [];
    const fakeSetInterval = (run: () => void, ms: number) => {
      const timer = { ms, unref: false, run };
      timers.push(timer);
      return {
        unref: () => {
          timer.unref = true;
        },
      };
    };
    const instance = (store: PostgresStore) =>
      new Function('store', 'setInterval', `${js}\nreturn purgeIdempotencyRecords;`)(
        store,
        fakeSetInterval,
      ) as () => Promise<number>;
    const a = instance(postgresStore({ client: pool, table }));
    const b = instance(postgresStore({ client: pool, table }));
    // Each instance sets one timer of a minute that does not hold the process open.
    expect(timers.map(({ ms, unref }) => ({ ms, unref }))).toEqual([
      { ms: 60_000, unref: true },
      { ms: 60_000, unref: true },
    ]);
    const [byA, byB] = await Promise.all([a(), b()]);
    expect(byA + byB).toBe(2505);
    const left = await pool.query<{ id: string }>(`SELECT id FROM "${table}"`);
    expect(left.rows.map((row) => row.id)).toEqual(['live']);
  });

  // Was vague: "outbox.purge(pool, { olderThan }) deletes them, in batches of the same kind" read as
  // one batch per call, like purgeExpired(), so an operator would wrap it in the same loop. One call
  // deletes batch after batch (each its own short transaction) until none is left.
  it('outbox.purge() drains a backlog in one call, batch after batch', async () => {
    const table = `audit_ops_outbox_${randomBytes(4).toString('hex')}`;
    tables.push(table);
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, status, created_at, delivered_at)
       SELECT 'd' || g, 'https://partner.example/hooks', '\\x7b7d', 'delivered', now() - interval '31 days', now() - interval '30 days'
         FROM generate_series(1, 2505) g`,
    );
    expect(await outbox.purge(pool, { olderThan: '7d' })).toEqual({ deleted: 2505 });
    says(
      '`outbox.purge(pool, { olderThan })` deletes them in batches of `batchSize` rows (1,000 by default), each its own short transaction, until none is left: one call drains a backlog',
    );
  });
});

describe('Rotating secrets and keys', () => {
  // The gateway's key, made here so that the test can sign with it as a thief would.
  const stolen = generateKeyPairSync('ed25519').privateKey;
  const forge = (key: KeyObject, kid: string, nowMs: number) =>
    new SignJWT({ scope: 'admin' })
      .setProtectedHeader({ alg: 'EdDSA', kid, typ: 'internal+jwt' })
      .setIssuer('https://gateway.test')
      .setSubject('mallory')
      .setAudience('orders')
      .setIssuedAt(Math.floor(nowMs / 1000))
      .setExpirationTime(Math.floor(nowMs / 1000) + 60)
      .sign(key);
  const accepts = async (verifier: Guard, token: string) =>
    (await verifier.authenticate({ headers: { 'idem-internal-token': token } })).ok;

  // Was wrong: "For a compromised key, rotate(key, { delay: 0 }). The compromised key stays
  // published, and verifiers take tokens signed with it, until its own last tokens have expired
  // (ttl + 60 s): guard.refreshKeys() cannot cut that shorter." True of a verifier given the
  // function; a service that fetches the gateway's JWKS over `jwksUri` keeps the key it cached until
  // it fetches the set again (the set's max-age, else defaultTtl: 10 minutes), so it took tokens the
  // thief signed for minutes after the key left the JWKS, unless refreshKeys() was called then.
  it('a compromised internal key, rotated with delay 0: gone from the JWKS after ttl + 60 s; a jwksUri verifier trusts it until refreshKeys()', async () => {
    let t = 1_800_000_000_000;
    const now = () => t;
    const gateway = createInternalTokenIssuer({
      issuer: 'https://gateway.test',
      keys: [{ kid: 'old', privateKey: stolen }],
      now,
    });
    const server = createServer((_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(gateway.jwks()));
    });
    const jwks = await listen(server);
    const jwksUri = `${jwks.url}/jwks`;
    try {
      const remote = createInternalVerifier({
        issuer: 'https://gateway.test',
        audience: 'orders',
        jwksUri,
        now,
        cache: false,
      });
      const inProcess = createInternalVerifier({
        issuer: 'https://gateway.test',
        audience: 'orders',
        jwks: () => gateway.jwks(),
        now,
        cache: false,
      });
      const first = await remote.authenticate({ headers: { 'idem-internal-token': await forge(stolen, 'old', t) } });
      if (!first.ok) throw new Error('expected the first token to pass');
      const rotatedAt = t;
      gateway.rotate(undefined, { delay: 0 });
      // The new key signs at once: a service that fetched the JWKS within its cooldown (30 s)
      // refuses its tokens (key_unknown) until the cooldown ends; the in-process one takes them.
      t = rotatedAt + 1_000;
      const fresh = await gateway.mint(first.principal, { audience: 'orders' });
      const early = await remote.authenticate({ headers: { 'idem-internal-token': fresh } });
      expect(early.ok ? undefined : early.error.code).toBe('key_unknown');
      expect(await accepts(inProcess, fresh)).toBe(true);
      t = rotatedAt + 31_000;
      expect(await accepts(remote, fresh)).toBe(true);
      // Published, and taken by both, while its last tokens may verify: ttl (60 s) plus 60 s.
      t = rotatedAt + 119_000;
      expect(gateway.jwks().keys.map((key) => key.kid)).toContain('old');
      expect(await accepts(inProcess, await forge(stolen, 'old', t))).toBe(true);
      t = rotatedAt + 121_000;
      expect(gateway.jwks().keys.map((key) => key.kid)).not.toContain('old');
      expect(await accepts(inProcess, await forge(stolen, 'old', t))).toBe(false);
      // The service on jwksUri still holds the set it fetched: the thief's tokens pass, minutes on.
      expect(await accepts(remote, await forge(stolen, 'old', t))).toBe(true);
      t = rotatedAt + 5 * 60_000;
      expect(await accepts(remote, await forge(stolen, 'old', t))).toBe(true);
      // refreshKeys() once the key is out of the JWKS ends it.
      await remote.refreshKeys();
      expect(await accepts(remote, await forge(stolen, 'old', t))).toBe(false);
    } finally {
      await jwks.close();
    }
    const internalKey = section('Rotating secrets and keys').replace(/\s+/g, ' ');
    says(
      'a service that fetched the JWKS over `jwksUri` less than its `cooldown` (30 s) ago refuses the new tokens (`401 key_unknown`) until that cooldown ends',
      internalKey,
    );
    says(
      'A service that fetches the JWKS over `jwksUri` keeps the compromised key in its cached set until it fetches the set again (its `max-age`, else `defaultTtl`, 600 s): call `guard.refreshKeys()` on every such service once the key has left the JWKS (`ttl` plus 60 s after the rotation)',
      internalKey,
    );
  });
});

// Every field of every guard event, as the page lists them ("Guard events, each with `at`: ...").
// The mapped type makes tsc fail when a field is listed that the union lacks, or one is left out.
type GuardFields<T extends GuardEvent['type']> = Exclude<keyof Extract<GuardEvent, { type: T }>, 'type' | 'at'>;
const guardEventFields = {
  authenticated: ['issuer', 'cached'],
  rejected: ['code', 'issuer'],
  'jwks-fetch': ['uri', 'ok', 'status', 'reason', 'keys', 'durationMs'],
  'jwks-rejected': ['uri', 'reason'],
  'jwks-key-dropped': ['uri', 'kid', 'reason'],
  'jwks-stale': ['uri', 'ageMs'],
} as const satisfies { [T in GuardEvent['type']]: readonly GuardFields<T>[] };
type Unlisted = {
  [T in GuardEvent['type']]: Exclude<GuardFields<T>, (typeof guardEventFields)[T][number]>;
}[GuardEvent['type']];
const everyGuardFieldListed: [Unlisted] extends [never] ? true : false = true;

describe('Metrics, traces and logs: the guard events', () => {
  // Was vague: the page gave the fields of three guard events and none of `jwks-rejected`,
  // `jwks-key-dropped` (its `kid`) and `jwks-stale` (its `ageMs`), nor `uri` and `keys` of `jwks-fetch`.
  it('names every guard event with all its fields', () => {
    expect(everyGuardFieldListed).toBe(true);
    const listed = Object.entries(guardEventFields)
      .map(([type, fields]) => `\`${type}\` (${fields.map((field) => `\`${field}\``).join(', ')})`)
      .join(', ');
    says(`Guard events, each with \`at\`: ${listed}.`);
  });
});

describe.skipIf(!withRedis)('Metrics, traces and logs', () => {
  const redis = new Redis(redisUrl);
  afterAll(async () => {
    const keys = await redis.keys('audit-ops:metrics:*');
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  // The events table: `not-stored` "the key is released (a `release` event comes first when the
  // policy or the handler released it ...)"; `release` "before each `not-stored`, and alone when the
  // adapter released the key of a response that is no outcome". The recipe's idem.outcomes counts
  // on this (docs/test/otel-recipe.test.ts).
  it('a key released by the policy or by the handler: release then not-stored; a 404 of no route: response-not-stored and release alone', async () => {
    const events: IdempotencyEvent[] = [];
    const store = redisStore({ client: redis, prefix: `audit-ops:metrics:${randomBytes(4).toString('hex')}:` });
    const app = express();
    app.use(
      idempotency({ store, scope: () => 'tenant-1', storeOutcome: 'success', onEvent: (event) => events.push(event) }),
    );
    app.post('/outage', (_req, res) => {
      res.status(503).json({ error: 'upstream down' });
    });
    app.post('/declined', (req, res) => {
      req.idempotency?.release();
      res.status(402).json({ error: 'card declined, nothing charged' });
    });
    const server = await listen(createServer(app));
    const post = async (path: string, key: string) => {
      events.length = 0;
      const response = await fetch(`${server.url}${path}`, {
        method: 'POST',
        headers: { 'idempotency-key': `"${key}"` },
      });
      await response.text();
      // The key is settled before the response ends; a last event may follow it by a store call.
      for (let i = 0; i < 50 && !events.some((e) => e.type === 'release'); i++)
        await new Promise((r) => setTimeout(r, 10));
      return { status: response.status, types: events.map((event) => event.type) };
    };
    try {
      expect(await post('/outage', 'k-outage')).toEqual({ status: 503, types: ['claim', 'release', 'not-stored'] });
      expect(await post('/declined', 'k-declined')).toEqual({ status: 402, types: ['claim', 'release', 'not-stored'] });
      const nowhere = await post('/nowhere', 'k-nowhere');
      expect(nowhere.status).toBe(404);
      expect(nowhere.types).toEqual(['claim', 'response-not-stored', 'release']);
    } finally {
      await server.close();
    }
    const table = section('Metrics, traces and logs');
    expect(table).toMatch(
      /\| `release` \| a claim was released: before each `not-stored`, and alone when the adapter released/,
    );
  });
});

describe.skipIf(!withPostgres)('PostgreSQL durability', () => {
  // "pg connects to one host (it does not take libpq's host=a,b target_session_attrs=read-write)".
  it("pg refuses libpq's multi-host connection strings: reach the primary through one endpoint", async () => {
    const { hostname, port } = new URL(databaseUrl);
    const pair = `${hostname}:${port || 5432},${hostname}:${port || 5432}`;
    expect(
      () => new pg.Client({ connectionString: `postgres://postgres@${pair}/postgres?target_session_attrs=read-write` }),
    ).toThrow(/Invalid URL/);
    const keywords = new pg.Client({
      connectionString: `host=${hostname},${hostname} port=${port || 5432} user=postgres dbname=postgres`,
    });
    await expect(keywords.connect()).rejects.toMatchObject({ code: 'ENOTFOUND' });
    says("pg connects to one host (it does not take libpq's `host=a,b target_session_attrs=read-write`)");
  });

  // "Listen for the pool's 'error' event (idle connections that die emit it)."
  it("an idle pooled connection that dies emits the pool's 'error' event", async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    try {
      const pid = (await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]?.pid;
      const errored = new Promise<Error>((resolve) => pool.once('error', resolve));
      await admin.query('SELECT pg_terminate_backend($1)', [pid]);
      expect((await errored).message).toMatch(/terminat/);
    } finally {
      await admin.end();
      await pool.end();
    }
    says("Listen for the pool's `'error'` event (idle connections that die emit it)");
  });
});

describe('What to alert on', () => {
  // Was wrong: "idem.guard.requests{idem.guard.code="signature_invalid"} spikes | Forged tokens, or a
  // key rotated without publishing it". A provider that signs with a key it has not published names
  // a kid the JWKS lacks: the guard refuses `key_unknown`, which no row of the table watched, so the
  // commonest rotation mistake (the page's own "a key that signs the moment it is published") raised
  // no alert. `signature_invalid` is a known kid (or none) whose key does not verify the signature.
  it('a provider signing with a key it never published gives key_unknown; a forgery under a published kid gives signature_invalid', async () => {
    const { generateKeyPair, exportJWK } = await import('jose');
    const published = await generateKeyPair('ES256', { extractable: true });
    const unpublished = await generateKeyPair('ES256', { extractable: true });
    const jwk = { ...(await exportJWK(published.publicKey)), kid: 'k-2026', alg: 'ES256', use: 'sig' };
    const server = createServer((_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ keys: [jwk] }));
    });
    const jwks = await listen(server);
    const jwksUri = `${jwks.url}/jwks`;
    const codes: string[] = [];
    const guard = createGuard({
      audience: 'https://api.test',
      issuers: [{ issuer: 'https://id.test', jwksUri, algorithms: ['ES256'] }],
      onEvent: (event) => {
        if (event.type === 'rejected') codes.push(event.code);
      },
    });
    const token = (key: CryptoKey, kid: string) =>
      new SignJWT({})
        .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid })
        .setIssuer('https://id.test')
        .setAudience('https://api.test')
        .setSubject('alice')
        .setExpirationTime('5m')
        .sign(key);
    const check = async (jwt: string) => guard.authenticate({ headers: { authorization: `Bearer ${jwt}` } });
    try {
      expect((await check(await token(published.privateKey, 'k-2026'))).ok).toBe(true);
      await check(await token(unpublished.privateKey, 'k-2027'));
      await check(await token(unpublished.privateKey, 'k-2026'));
      expect(codes).toEqual(['key_unknown', 'signature_invalid']);
    } finally {
      await jwks.close();
    }
    const alerts = section('Metrics, traces and logs');
    says(
      '| `idem.guard.requests{idem.guard.code="key_unknown"}` rising | Tokens name a key the JWKS lacks: the identity provider signs with a key it has not published, or published less than a guard\'s `cooldown` ago (see [the identity provider\'s signing key](#the-identity-providers-signing-key-any-issuer-behind-idemguard)) |',
      alerts,
    );
    says(
      '| `idem.guard.requests{idem.guard.code="signature_invalid"}` spikes | Forged tokens, or a key replaced under the same `kid` without publishing it |',
      alerts,
    );
  });
});

describe('What to alert on, memory store', () => {
  // Was incomplete: "memoryStore's evicted above zero | maxEntries holds less than one retention
  // period of writes". maxBytes (256 MiB) evicts as maxEntries does, and is the bound that bites first
  // with large responses; the row named only the count.
  it('maxBytes, not only maxEntries, drops completed records before their retention, counted in evicted and onEvict', async () => {
    const t = 1_800_000_000_000;
    const evictions: string[] = [];
    const store = memoryStore({ maxBytes: 8 * 1024, now: () => t, onEvict: ({ id }) => evictions.push(id) });
    const engine = createIdempotency({ store, now: () => t });
    for (let i = 0; i < 12; i++) {
      const started = await engine.begin({ key: `k-${i}`, scope: 's', operation: 'POST /exports', fingerprint: 'f' });
      if (started.kind !== 'execute') throw new Error('expected execute');
      await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array(1024) });
    }
    expect(store.size).toBeLessThan(12);
    expect(store.evicted).toBe(12 - store.size);
    expect(evictions).toHaveLength(store.evicted);
    says(
      "| memoryStore's `evicted` above zero (or `onEvict` firing) | `maxEntries` or `maxBytes` holds less than one retention period of writes",
    );
  });
});

describe.skipIf(!withRedis)('What to alert on, on Redis', () => {
  // Was wrong: "idem.store.errors above zero for minutes | Clients are getting 503". True of the
  // phases `claim` and `get`; a failed `complete` comes after the handler ran, and its client got the
  // handler's answer: the engine stores it again in the background (a retry meanwhile gets 409, then
  // the replay). An operator reading 503s into every store error looked for the wrong symptom.
  it("a store error of phase complete: the client got the handler's answer, the outcome is stored in the background, the retry replays it", async () => {
    const target = new URL(redisUrl);
    const proxy = await createTcpProxy({ target: { host: target.hostname, port: Number(target.port || 6379) } });
    const redis = new Redis({ host: '127.0.0.1', port: proxy.port, maxRetriesPerRequest: 1 });
    redis.on('error', () => {});
    const direct = new Redis(redisUrl);
    const prefix = `audit-ops:alerts:${randomBytes(4).toString('hex')}:`;
    const events: IdempotencyEvent[] = [];
    const app = express();
    app.use(
      idempotency({
        store: redisStore({ client: redis, prefix }),
        storeTimeout: '300ms',
        scope: () => 'tenant-1',
        onEvent: (e) => events.push(e),
      }),
    );
    let runs = 0;
    app.post('/charges', (_req, res) => {
      runs++;
      proxy.cut(); // the store goes away while the handler runs: its completion fails
      res.status(201).json({ id: `ch_${runs}` });
    });
    const server = await listen(createServer(app));
    try {
      const init = { method: 'POST', headers: { 'idempotency-key': '"k-complete"' } };
      const first = await fetch(`${server.url}/charges`, init);
      expect(first.status).toBe(201);
      expect(await first.json()).toEqual({ id: 'ch_1' });
      expect(events.map((e) => (e.type === 'store-error' ? `${e.type}:${e.phase}` : e.type))).toEqual([
        'claim',
        'store-error:complete',
      ]);
      proxy.restore();
      for (let i = 0; i < 100 && !events.some((e) => e.type === 'complete'); i++)
        await new Promise((r) => setTimeout(r, 50));
      const retry = await fetch(`${server.url}/charges`, init);
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.json()).toEqual({ id: 'ch_1' });
      expect(runs).toBe(1);
    } finally {
      await server.close();
      redis.disconnect();
      const keys = await direct.keys(`${prefix}*`);
      if (keys.length > 0) await direct.del(...keys);
      direct.disconnect();
      await proxy.close();
    }
    says(
      "| `idem.store.errors` above zero for minutes (by `idem.phase`) | The store is down, slow (`storeTimeout`) or full. On `claim` and `get` clients get 503 and nothing runs (under `storeUnavailable: 'fail-open'` a first claim that could not reach the store, its `StoreUnavailableError` or `storeTimeout`, runs the handler unprotected instead: `idem.unprotected` on the counter, and a retry of it runs again); on `complete` the client got the handler's answer, which the engine tries to store again in the background, five times over about three seconds (a retry meanwhile gets 409, then the replay), and if it still fails the outcome is lost: the key is released (or abandoned when its lease ends) and a retry runs the operation again; on `renew` leases may be lost (`idem.leases.lost`) |",
      section('Metrics, traces and logs'),
    );
  });
});

describe('Behind nginx or HAProxy', () => {
  // "keep nginx's upstream keepalive_timeout below Node's server.keepAliveTimeout (5 s by default)".
  // Was incomplete: Express and Koa leave Node's 5 s, Fastify sets its own, 72 s. The advice holds
  // (4 s is below both); the figure is now given for each.
  it("the servers' keep-alive timeouts are the ones the page gives: 5 s on Express and Koa, 72 s on Fastify", async () => {
    const fromExpress = express().listen(0, '127.0.0.1');
    const fromKoa = new Koa().listen(0, '127.0.0.1');
    const fastify = Fastify();
    await fastify.listen({ port: 0, host: '127.0.0.1' });
    try {
      expect(fromExpress.keepAliveTimeout).toBe(5_000);
      expect(fromKoa.keepAliveTimeout).toBe(5_000);
      expect(fastify.server.keepAliveTimeout).toBe(72_000);
    } finally {
      fromExpress.close();
      fromKoa.close();
      await fastify.close();
    }
    says("below Node's `server.keepAliveTimeout` (5 s by default, as Express and Koa leave it; Fastify sets 72 s)");
  });
});
