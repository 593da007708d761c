// Audit of docs/concepts.md and docs/reliability.md against behaviour: each test checks a sentence of
// the page that no other test pinned on a real store (most of the engine's own tests run on the
// memory store). Crashes are an engine with `heartbeat: false` and the shortest lease (100 ms): the
// store's own clock ends it, and the tests poll the store for that, as the reliability suite does;
// nothing sleeps out a TTL. Redis keys live under `audit-concepts:`; PostgreSQL uses a table of
// this file's own.
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  createIdempotency,
  downstreamKey,
  type IdempotencyEngine,
  type IdempotencyEvent,
  type IdempotencyOptions,
  isLeaseLost,
  type Lease,
  type Store,
  type StoredResponse,
} from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, until } from '../../packages/core/test/support/timeouts-kit.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const read = (path: string) => readFileSync(join(root, path), 'utf8');

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the concepts/reliability audit tests on that store';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);

const run = randomUUID();
const table = `audit_concepts_${run.replaceAll('-', '').slice(0, 12)}`;

let redis: Redis | undefined;
let pool: pg.Pool | undefined;

beforeAll(async () => {
  if (withRedis) redis = new Redis(redisUrl, { maxRetriesPerRequest: 0 });
  if (withPostgres) {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
    pool.on('error', () => {});
    await migrate(pool, { table });
  }
});

afterAll(async () => {
  if (redis) {
    const keys = await redis.keys(`audit-concepts:${run}:*`);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  }
  if (pool) {
    await pool.query(`DROP TABLE IF EXISTS ${table}`);
    await pool.end();
  }
});

const backends: { name: string; available: boolean; store: () => Store }[] = [
  {
    name: 'redis',
    available: withRedis,
    store: () => redisStore({ client: redis as Redis, prefix: `audit-concepts:${run}:` }),
  },
  { name: 'postgres', available: withPostgres, store: () => postgresStore({ client: pool as pg.Pool, table }) },
];

const body = (text: string): StoredResponse => ({
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(text),
});
const text = (response: StoredResponse) => new TextDecoder().decode(response.body);

// An engine on `store` whose events are kept.
function engineOn(store: Store, options: Partial<IdempotencyOptions> = {}) {
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({ store, onEvent: (event) => events.push(event), ...options });
  return { engine, events };
}

// A process that "crashes": nothing renews its leases, and the store ends them after 100 ms.
const crashing = (store: Store, options: Partial<IdempotencyOptions> = {}) =>
  engineOn(store, { heartbeat: false, lease: '100ms', ...options });

// Polls the store (its clock decides) until the record is in `state`.
async function untilState(store: Store, id: string, state: 'abandoned' | 'completed' | undefined, withinMs = 5_000) {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const record = await store.get(id);
    if (record?.state === state) return record;
    if (Date.now() > deadline) throw new Error(`record ${id} never became ${state}; it is ${record?.state}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const input = (key: string, fingerprint: string, more: { scope?: string; operation?: string } = {}) => ({
  key,
  scope: more.scope ?? 'user:alice',
  operation: more.operation ?? 'POST /charges',
  fingerprint,
});

async function executed(engine: IdempotencyEngine, begin: ReturnType<typeof input>): Promise<Lease> {
  const started = await engine.begin(begin);
  if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
  return started.lease;
}

// A fresh key whose first run (fingerprint `body-a`) crashed: its lease ran out, the record is abandoned.
async function abandonedKey(store: Store) {
  const key = randomUUID();
  const crashed = crashing(store);
  const first = await executed(crashed.engine, input(key, 'body-a'));
  await untilState(store, first.id, 'abandoned');
  return { key, crashed, first };
}

// A fresh key's run on an engine that stops renewing after `maxExecution` (1.2 s, two 600 ms leases):
// the handler hangs, and the test decides when (and whether) it answers. Real time on a real store:
// a lease of 150 ms lost itself to a renewal answered late on a loaded box (renew-failed before
// max-execution); 600 ms leaves a renewal 400 ms.
async function hungRun(store: Store) {
  const key = randomUUID();
  const hung = engineOn(store, { lease: '600ms', maxExecution: '1200ms' });
  const lease = await executed(hung.engine, input(key, 'body-a'));
  return { key, hung, lease };
}

// A store whose calls are counted, and whose `complete` can be made to hang.
function wrap(store: Store) {
  const calls = { claim: 0, get: 0, renew: 0, complete: 0, release: 0 };
  let hang = false;
  const wrapped: Store = {
    claim: (i) => {
      calls.claim++;
      return store.claim(i);
    },
    renew: (i) => {
      calls.renew++;
      return store.renew(i);
    },
    complete: (i) => {
      calls.complete++;
      return hang ? new Promise<boolean>(() => {}) : store.complete(i);
    },
    release: (i) => {
      calls.release++;
      return store.release(i);
    },
    get: (id) => {
      calls.get++;
      return store.get(id);
    },
  };
  return { wrapped, calls, hangCompletions: () => (hang = true) };
}

describe('docs/concepts.md', () => {
  describe.each(backends)('the state machine on $name', ({ available, store: makeStore }) => {
    // "| abandoned, same request | the takeover: `execute`, with `lease.recovered` true |", "| abandoned,
    // different request under the key | `422` (or `400 idempotency_error`) |", and "The takeover's lease
    // says `recovered: true`, and so does its `claim` event".
    it.runIf(available)(
      'an abandoned key: other parameters get 422 (or 400), the same ones take it over, recovered',
      async () => {
        const store = makeStore();
        const { key } = await abandonedKey(store);

        const strict = engineOn(store);
        const other = await strict.engine.begin(input(key, 'body-b'));
        expect(other).toMatchObject({ kind: 'reject', error: { code: 'fingerprint_mismatch', status: 422 } });
        const lenient = engineOn(store, { mismatchStatus: 400 });
        const other400 = await lenient.engine.begin(input(key, 'body-b'));
        expect(other400).toMatchObject({ kind: 'reject', error: { code: 'idempotency_error', status: 400 } });

        const retry = await strict.engine.begin(input(key, 'body-a'));
        expect(retry.kind).toBe('execute');
        const lease = (retry as { lease: Lease }).lease;
        expect(lease.recovered).toBe(true);
        expect(strict.events.filter((event) => event.type === 'claim')).toMatchObject([{ recovered: true }]);
        await strict.engine.complete(lease, body('{"id":"ch_1"}'));
      },
    );

    // "A recovered run that had no effect (its outcome released by the policy, or `release()`) leaves
    // the key abandoned rather than unseen: the crashed attempt's parameters are still the only ones
    // that run."
    it.runIf(available)(
      'a recovered run released leaves the key abandoned: still 422 for others, the same request runs',
      async () => {
        const store = makeStore();
        const { key, first } = await abandonedKey(store);
        const { engine } = engineOn(store);
        const recovered = await executed(engine, input(key, 'body-a'));
        expect(await engine.release(recovered)).toEqual({ ok: true });

        // Its lease is ended at once (renewed to 1 ms, by the store's clock).
        await untilState(store, first.id, 'abandoned', 1_000);
        expect(await engine.begin(input(key, 'body-b'))).toMatchObject({ kind: 'reject', error: { status: 422 } });
        const again = await executed(engine, input(key, 'body-a'));
        expect(again.recovered).toBe(true);
        await engine.complete(again, body('{}'));
      },
    );

    // "The crashed attempt's holder keeps its token until someone takes over: if it was only stalled
    // and answers before that, its outcome is stored".
    it.runIf(available)(
      'a stalled holder that answers before any takeover has its outcome stored and replayed',
      async () => {
        const store = makeStore();
        const { key, crashed: stalled, first: lease } = await abandonedKey(store);
        expect(await stalled.engine.complete(lease, body('{"id":"late"}'))).toEqual({ ok: true, stored: true });
        const { engine } = engineOn(store);
        const replay = await engine.begin(input(key, 'body-a'));
        expect(replay.kind).toBe('replay');
        expect(text((replay as { response: StoredResponse }).response)).toBe('{"id":"late"}');
      },
    );

    // "## Fencing tokens": "Worker A wakes up and tries to store its outcome. Its token is no longer
    // current: the store refuses, `complete()` returns `{ ok: false, reason: 'lease-lost' }`, and a
    // `lease-lost` event is emitted. The late finisher never overwrites B's outcome."
    it.runIf(available)(
      'the fencing timeline: the late finisher is refused with lease-lost and B’s outcome stays',
      async () => {
        const store = makeStore();
        const { key, crashed: a, first: leaseA } = await abandonedKey(store);
        const b = engineOn(store);
        const leaseB = await executed(b.engine, input(key, 'body-a'));
        expect(leaseB.token).not.toBe(leaseA.token);

        expect(await a.engine.complete(leaseA, body('{"by":"A"}'))).toEqual({ ok: false, reason: 'lease-lost' });
        expect(a.events.filter((event) => event.type === 'lease-lost')).toHaveLength(1);
        expect(await b.engine.complete(leaseB, body('{"by":"B"}'))).toEqual({ ok: true, stored: true });
        // A's late completion again, after B's: still refused, B's outcome is what replays.
        expect(await a.engine.complete(leaseA, body('{"by":"A"}'))).toMatchObject({ ok: false, reason: 'lease-lost' });
        const replay = await b.engine.begin(input(key, 'body-a'));
        expect(text((replay as { response: StoredResponse }).response)).toBe('{"by":"B"}');
      },
    );

    // "Every claim carries a fresh token, used by no other claim (a random prefix per engine and a
    // counter)." Was "a fresh random token": each is not random, only unique.
    it.runIf(available)('every claim has a token of its own, across claims and engines', async () => {
      const store = makeStore();
      const one = engineOn(store).engine;
      const two = engineOn(store).engine;
      const leases = [
        await executed(one, input(randomUUID(), 'a')),
        await executed(one, input(randomUUID(), 'a')),
        await executed(two, input(randomUUID(), 'a')),
      ];
      expect(new Set(leases.map((lease) => lease.token)).size).toBe(3);
      expect(leases[0]?.token.slice(0, 8)).toBe(leases[1]?.token.slice(0, 8));
      expect(leases[0]?.token.slice(0, 8)).not.toBe(leases[2]?.token.slice(0, 8));
      for (const lease of leases) await (lease === leases[2] ? two : one).complete(lease, body('{}'));
    });

    // "If it is in this process, the takeover marks its lease lost, so its `signal` aborts." And its
    // reason "is an `IdempotencyError` with code `lease_lost` (`isLeaseLost(error)`)".
    it.runIf(available)(
      'a takeover in the same process aborts the stalled lease’s signal with lease_lost',
      async () => {
        const store = makeStore();
        const {
          key,
          crashed: { engine, events },
          first: stalled,
        } = await abandonedKey(store);
        const signal = stalled.signal;
        const takeover = await executed(engine, input(key, 'body-a'));
        expect(takeover.recovered).toBe(true);
        expect(signal.aborted).toBe(true);
        expect(isLeaseLost(signal.reason)).toBe(true);
        expect(events.filter((event) => event.type === 'lease-lost')).toMatchObject([{ reason: 'taken-over' }]);
        await engine.complete(takeover, body('{}'));
      },
    );

    // "`maxExecution` ... a lease that old ... is no longer renewed. Its `signal` aborts, a
    // `lease-lost` event with reason `max-execution` is emitted, and a retry runs once the store lets
    // the lease go, within one lease more. ... one that throws then (it stopped on its `signal`, as
    // it should) is settled as a crash: nothing stored, the key abandoned for the same request to
    // take over (a `not-stored` event)."
    it.runIf(available)(
      'maxExecution: lease-lost max-execution, then a thrown answer leaves the key abandoned for the same request',
      async () => {
        const store = makeStore();
        const { key, hung, lease } = await hungRun(store);
        await until(() => lease.signal.aborted, 5_000);
        expect(lease.signal.aborted).toBe(true);
        expect(hung.events.filter((event) => event.type === 'lease-lost')).toMatchObject([{ reason: 'max-execution' }]);

        // The handler stops on its signal: a thrown answer.
        expect(await hung.engine.complete(lease, body('{"error":"stopped"}'), { status: 503, thrown: true })).toEqual({
          ok: true,
          stored: false,
        });
        expect(hung.events.filter((event) => event.type === 'not-stored')).toHaveLength(1);
        // Abandoned by a renewal to 1 ms: PostgreSQL reads it in progress for up to that millisecond.
        await untilState(store, lease.id, 'abandoned');
        const other = engineOn(store);
        expect(await other.engine.begin(input(key, 'body-b'))).toMatchObject({
          kind: 'reject',
          error: { status: 422 },
        });
        const retry = await executed(other.engine, input(key, 'body-a'));
        expect(retry.recovered).toBe(true);
        await other.engine.complete(retry, body('{}'));
      },
    );

    // "A handler that answers before a retry took its key over still has its outcome stored" (after
    // maxExecution), "One that answers after is a late finisher (below): its response is served, not
    // stored."
    it.runIf(available)(
      'maxExecution: an answer after a retry took the key over is fenced, the retry’s is kept',
      async () => {
        const store = makeStore();
        const { key, hung, lease } = await hungRun(store);
        await untilState(store, lease.id, 'abandoned');
        expect(hung.events.filter((event) => event.type === 'lease-lost')).toMatchObject([{ reason: 'max-execution' }]);
        const other = engineOn(store);
        const retry = await executed(other.engine, input(key, 'body-a'));
        expect(await hung.engine.complete(lease, body('{"by":"hung"}'))).toMatchObject({
          ok: false,
          reason: 'lease-lost',
        });
        await other.engine.complete(retry, body('{"by":"retry"}'));
        const replay = await other.engine.begin(input(key, 'body-a'));
        expect(text((replay as { response: StoredResponse }).response)).toBe('{"by":"retry"}');
      },
    );

    // The same sentence's other half: "its outcome released by the policy" (a 429 under `'all'`).
    it.runIf(available)('a recovered run whose outcome the policy releases leaves the key abandoned too', async () => {
      const store = makeStore();
      const { key, first } = await abandonedKey(store);
      const { engine } = engineOn(store);
      const recovered = await executed(engine, input(key, 'body-a'));
      expect(await engine.complete(recovered, { ...body('{}'), status: 429 })).toEqual({ ok: true, stored: false });
      await untilState(store, first.id, 'abandoned', 1_000);
      expect(await engine.begin(input(key, 'body-b'))).toMatchObject({ kind: 'reject', error: { status: 422 } });
    });

    // "A handler that answers before a retry took its key over still has its outcome stored".
    it.runIf(available)(
      'maxExecution: an answer after the lease was given up, before any takeover, is stored',
      async () => {
        const store = makeStore();
        const { key, hung, lease } = await hungRun(store);
        await until(() => lease.signal.aborted, 5_000);
        expect(hung.events.filter((event) => event.type === 'lease-lost')).toMatchObject([{ reason: 'max-execution' }]);
        expect(await hung.engine.complete(lease, body('{"by":"slow"}'))).toEqual({ ok: true, stored: true });
        const replay = await engineOn(store).engine.begin(input(key, 'body-a'));
        expect(text((replay as { response: StoredResponse }).response)).toBe('{"by":"slow"}');
      },
    );

    // "## Calls to other services": "The key is a UUID (version 8, from SHA-256) of the record id, the
    // request's fingerprint and the purpose, so it is the same on every run of one request and
    // differs for another caller, route, key, body or purpose."
    it.runIf(available)(
      'downstreamKey: the same on the crashed run and its takeover, another for any other part',
      async () => {
        const store = makeStore();
        const { key, first } = await abandonedKey(store);
        const { engine } = engineOn(store);
        const second = await executed(engine, input(key, 'body-a'));
        const charge = downstreamKey(first, 'charge');
        expect(charge).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
        expect(downstreamKey(second, 'charge')).toBe(charge);
        expect(charge).not.toContain(key);

        const others = [
          await executed(engine, input(key, 'body-a', { scope: 'user:bob' })),
          await executed(engine, input(key, 'body-a', { operation: 'POST /refunds' })),
          await executed(engine, input(randomUUID(), 'body-a')),
          await executed(engine, input(randomUUID(), 'body-b')),
        ];
        const keys = new Set([
          charge,
          downstreamKey(second, 'refund'),
          ...others.map((l) => downstreamKey(l, 'charge')),
        ]);
        expect(keys.size).toBe(6);
        for (const lease of [second, ...others]) await engine.complete(lease, body('{}'));
      },
    );

    // "Called directly, `engine.begin()` takes any string as the fingerprint and stores a SHA-256 of it
    // (a hex SHA-256, as the adapters pass, as given), never the text itself." Was vague: what is
    // stored is `sha256:` and the hex SHA-256 of the string's JSON text, which a reader comparing a
    // record with sha256(text) would not find. The page now says so.
    it.runIf(available)(
      'begin() stores sha256: and the SHA-256 of a text fingerprint’s JSON, a hex SHA-256 as given',
      async () => {
        const store = makeStore();
        const { engine } = engineOn(store);
        const secret = 'card=4242424242424242';
        const one = await executed(engine, input(randomUUID(), secret));
        const stored = (await store.get(one.id))?.fingerprint;
        expect(stored).not.toContain(secret);
        expect(stored).toBe(`sha256:${createHash('sha256').update(JSON.stringify(secret)).digest('hex')}`);
        const digest = createHash('sha256').update('x').digest('hex');
        const two = await executed(engine, input(randomUUID(), digest));
        expect((await store.get(two.id))?.fingerprint).toBe(digest);
        await engine.complete(one, body('{}'));
        await engine.complete(two, body('{}'));
      },
    );
  });

  // "## Concurrency": "Waiters in one process share a single poll loop per key, and a second request
  // for a key that this very process is executing is answered without a store round trip".
  describe.each(backends)('concurrency on $name', ({ available, store: makeStore }) => {
    it.runIf(available)(
      'a second request for a key this process executes costs no store call: 409 at once',
      async () => {
        const { wrapped, calls } = wrap(makeStore());
        const { engine } = engineOn(wrapped);
        const key = randomUUID();
        const lease = await executed(engine, input(key, 'body-a'));
        for (let i = 0; i < 5; i++) {
          expect(await engine.begin(input(key, 'body-a'))).toMatchObject({
            kind: 'reject',
            error: { code: 'in_progress', status: 409, retryAfter: 1 },
          });
        }
        expect({ claim: calls.claim, get: calls.get }).toEqual({ claim: 1, get: 0 });
        await engine.complete(lease, body('{}'));
      },
    );

    // ...but only without `wait`: with it, the second request asks the store (one claim), then joins
    // the poll loop. Was vague: the page said it "is answered without a store round trip" after
    // describing `wait`; it now says "without `wait`".
    it.runIf(available)('with wait, a second request for a key this process executes asks the store once', async () => {
      const { wrapped, calls } = wrap(makeStore());
      const { engine } = engineOn(wrapped, { wait: '2s' });
      const key = randomUUID();
      const lease = await executed(engine, input(key, 'body-a'));
      const second = engine.begin(input(key, 'body-a'));
      await until(() => calls.get > 0, 5_000);
      expect(calls.claim).toBe(2);
      await engine.complete(lease, body('{"id":"won"}'));
      expect((await second).kind).toBe('replay');
      expect(read('docs/concepts.md')).toMatch(/without `wait`, a second request for a key that this very process/);
    });

    it.runIf(available)(
      'ten waiters in one process share one poll loop, and all get the winner’s response',
      async () => {
        const store = makeStore();
        const winner = engineOn(store);
        const key = randomUUID();
        const lease = await executed(winner.engine, input(key, 'body-a'));
        const { wrapped, calls } = wrap(store);
        const { engine } = engineOn(wrapped, { wait: '5s' });
        const waiting = Array.from({ length: 10 }, () => engine.begin(input(key, 'body-a')));
        // Complete once the poll loop has asked the store once.
        await until(() => calls.get > 0, 5_000);
        await winner.engine.complete(lease, body('{"id":"won"}'));
        const results = await Promise.all(waiting);
        for (const result of results) {
          expect(result.kind).toBe('replay');
          expect(text((result as { response: StoredResponse }).response)).toBe('{"id":"won"}');
        }
        // One loop: a few polls in all, not one per waiter.
        expect(calls.get).toBeLessThan(10);
      },
    );
  });
});

// A real server on port 0 for each framework, every route answering with the run's number.
type Serve = (options: Record<string, unknown>) => Promise<{ url: string; runs: () => number; close(): Promise<void> }>;
const servers: { name: string; serve: Serve }[] = [
  {
    name: 'Express, on the route',
    serve: async (options) => {
      let runs = 0;
      const app = express();
      app.post('/accounts/:id/charges', expressIdempotency(options as never), (_req, res) => {
        res.status(201).json({ run: ++runs });
      });
      return { ...(await listen(http.createServer(app))), runs: () => runs };
    },
  },
  {
    name: 'Fastify',
    serve: async (options) => {
      let runs = 0;
      const app = Fastify();
      await app.register(fastifyIdempotency, options as never);
      app.post('/accounts/:id/charges', async (_request, reply) => reply.code(201).send({ run: ++runs }));
      const url = await app.listen({ port: 0, host: '127.0.0.1' });
      return { url, runs: () => runs, close: () => app.close() };
    },
  },
];

describe('docs/concepts.md over HTTP', () => {
  describe.runIf(withRedis).each(servers)('$name on Redis', ({ serve }) => {
    const store = () => redisStore({ client: redis as Redis, prefix: `audit-concepts:${run}:http:` });
    const post = (url: string, path: string, key: string) =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'idempotency-key': `"${key}"`, 'content-type': 'application/json' },
        body: '{"amount":100}',
      });

    // "The parameters' values are not part of it: the same key sent to `/accounts/1/charges` and then
    // `/accounts/2/charges` is one record, whose fingerprint (it holds the concrete path) differs, so
    // the second gets 422, never the first's response."
    it('one key on /accounts/1/charges then /accounts/2/charges: 422, the handler ran once', async () => {
      const server = await serve({ store: store(), scope: () => 'user:alice' });
      try {
        const key = randomUUID();
        expect((await post(server.url, '/accounts/1/charges', key)).status).toBe(201);
        const second = await post(server.url, '/accounts/2/charges', key);
        expect(second.status).toBe(422);
        expect(second.headers.get('content-type')).toMatch(/^application\/problem\+json/);
        expect(await second.text()).not.toContain('"run"');
        expect(server.runs()).toBe(1);
      } finally {
        await server.close();
      }
    });

    // "with `advertiseExpiry: true`, ... a stored outcome carries `Idempotency-Expires`, an HTTP-date
    // (the server's clock plus the outcome's retention, rounded down to the second), and its replays
    // the same date."
    it('advertiseExpiry: the clock plus the retention, rounded down to the second, and the same date on replays', async () => {
      let now = Date.UTC(2026, 0, 2, 3, 4, 5, 999);
      const server = await serve({
        store: store(),
        scope: () => 'user:alice',
        advertiseExpiry: true,
        retention: '48h',
        now: () => now,
      });
      try {
        const key = randomUUID();
        const first = await post(server.url, '/accounts/1/charges', key);
        const expires = new Date(Date.UTC(2026, 0, 4, 3, 4, 5)).toUTCString();
        expect(first.headers.get('idempotency-expires')).toBe(expires);
        now += 60_000;
        const replay = await post(server.url, '/accounts/1/charges', key);
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(replay.headers.get('idempotency-expires')).toBe(expires);
      } finally {
        await server.close();
      }
    });
  });

  // The same sentence, for Express mounted app-wide: there the operation is the path as the router
  // matches it ("Express and Koa mounted app-wide claim before routing"), so the two paths are two
  // records and the second runs. Was vague: the Scope section said "one record ... 422" without the
  // condition; it now says where it holds.
  it.runIf(withRedis)(
    'Express mounted app-wide: /accounts/1/charges and /accounts/2/charges are two records, both run',
    async () => {
      let runs = 0;
      const app = express();
      app.use(
        expressIdempotency({
          store: redisStore({ client: redis as Redis, prefix: `audit-concepts:${run}:http:` }),
          scope: () => 'user:alice',
        }),
      );
      app.post('/accounts/:id/charges', (_req, res) => {
        res.status(201).json({ run: ++runs });
      });
      const { url, close } = await listen(http.createServer(app));
      try {
        const key = randomUUID();
        const init = { method: 'POST', headers: { 'idempotency-key': `"${key}"` } };
        expect((await fetch(`${url}/accounts/1/charges`, init)).status).toBe(201);
        expect((await fetch(`${url}/accounts/2/charges`, init)).status).toBe(201);
        expect(runs).toBe(2);
      } finally {
        await close();
      }
      expect(read('docs/concepts.md')).toMatch(/on a route's own instance and on Fastify[^.]*is one record/);
    },
  );
});

describe('docs/reliability.md', () => {
  describe.each(backends)('Limits and findings, on $name', ({ available, store: makeStore }) => {
    // "A hot completed key costs one store read per replay here: the workers run without
    // `replayCache`. ... with `replayCache: { ttl }` a completed key's repeats are too [free], one
    // store read per `ttl`."
    it.runIf(available)('a completed key: one store call per replay, or one per replayCache ttl', async () => {
      const { wrapped, calls } = wrap(makeStore());
      const plain = engineOn(wrapped).engine;
      const key = randomUUID();
      await plain.complete(await executed(plain, input(key, 'body-a')), body('{"id":"hot"}'));
      const before = { ...calls };
      for (let i = 0; i < 5; i++) expect((await plain.begin(input(key, 'body-a'))).kind).toBe('replay');
      expect(calls.claim + calls.get - before.claim - before.get).toBe(5);

      let now = 1_000_000;
      const cached = engineOn(wrapped, { replayCache: { ttl: '1s' }, now: () => now }).engine;
      const start = calls.claim + calls.get;
      for (let i = 0; i < 5; i++) expect((await cached.begin(input(key, 'body-a'))).kind).toBe('replay');
      expect(calls.claim + calls.get - start).toBe(1);
      now += 1_000;
      for (let i = 0; i < 5; i++) expect((await cached.begin(input(key, 'body-a'))).kind).toBe('replay');
      expect(calls.claim + calls.get - start).toBe(2);
    });

    // "A request makes two store calls, each bounded by `storeTimeout`. The claim and the completion;
    // when a completion fails, its further tries (and, if they all fail, the release that frees the
    // key) run in the background and add no wait".
    it.runIf(available)(
      'a completion that hangs answers store-error after one storeTimeout; its retries are in the background',
      async () => {
        const { wrapped, calls, hangCompletions } = wrap(makeStore());
        const { engine, events } = engineOn(wrapped, { storeTimeout: '200ms' });
        const lease = await executed(engine, input(randomUUID(), 'body-a'));
        hangCompletions();
        const result = await engine.complete(lease, body('{}'));
        expect(result).toMatchObject({ ok: false, reason: 'store-error' });
        // Answered after the first try alone: the next one waits 100 ms in the background.
        expect(calls.complete).toBe(1);
        expect(events.filter((event) => event.type === 'store-error')).toMatchObject([{ phase: 'complete' }]);
        // The key stays held meanwhile (the retry would get 409, not run).
        expect(await store409(makeStore(), lease)).toBe(true);
      },
    );

    // "it aborts when a renewal is refused": an operator's `forget` of a record in progress frees it,
    // and its holder's next renewal is refused.
    it.runIf(available)('a renewal the store refuses aborts the signal (lease-lost, renew-refused)', async () => {
      const store = makeStore();
      const { engine, events } = engineOn(store, { lease: '300ms' });
      const lease = await executed(engine, input(randomUUID(), 'body-a'));
      const record = await store.get(lease.id);
      expect(await store.forget?.({ id: lease.id, token: record?.token as string })).toBe(true);
      await until(() => lease.signal.aborted, 5_000);
      expect(lease.signal.aborted).toBe(true);
      expect(isLeaseLost(lease.signal.reason)).toBe(true);
      expect(events.filter((event) => event.type === 'lease-lost')).toMatchObject([{ reason: 'renew-refused' }]);
    });
  });

  // The harness the page names is exported from @idem/testkit, and the worker is set up as it says.
  it('the harness and the worker are as the page describes them', async () => {
    const testkit = await import('@idem/testkit');
    for (const name of ['startWorkers', 'createTcpProxy', 'createCutProxy', 'skewedClock'] as const) {
      expect(typeof testkit[name]).toBe('function');
    }
    const ahead = testkit.skewedClock(30_000, () => 1_000);
    const behind = testkit.skewedClock(-30_000, () => 1_000);
    expect(ahead() - behind()).toBe(60_000);

    const worker = read('packages/testkit/test/reliability/fixtures/charge-worker.ts');
    for (const point of ['inside-handler', 'after-write', 'after-complete']) expect(worker).toContain(`'${point}'`);
    expect(worker).toMatch(/enableOfflineQueue: false/);
    expect(worker).toMatch(/maxRetriesPerRequest: 0/);
    expect(worker).toContain("app.get('/stats'");
    const config = read('vitest.config.ts');
    expect(config).toMatch(/name: 'reliability',\s+include: \[reliability\],[\s\S]*?maxWorkers: 1/);
    const scripts = JSON.parse(read('package.json')).scripts as Record<string, string>;
    expect(scripts['test:chaos']).toMatch(/IDEM_CHAOS=1 .*--project reliability.*soak\.int\.test\.ts/);
    const hostile = read('packages/testkit/test/hostile/servers.ts');
    expect(hostile).toContain('maxBodyBytes = 64 * 1024');
  });
});

// True when a fresh engine on `store` is refused 409 for the lease's key (it is still held).
async function store409(store: Store, lease: Lease): Promise<boolean> {
  const { engine } = engineOn(store);
  const again = await engine.begin({
    key: lease.key,
    scope: lease.scope,
    operation: lease.operation,
    fingerprint: lease.fingerprint,
  });
  return again.kind === 'reject' && again.error.status === 409;
}
