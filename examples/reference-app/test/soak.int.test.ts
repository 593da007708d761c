// Soak (issue 10): the whole reference app, in-process, on the real PostgreSQL and Redis, under mixed
// load for a bounded time (8 s; 60 s with IDEM_CHAOS=1). Access tokens come from the app's own
// identity provider and are refreshed through its token endpoint while the load runs.
//
// Virtual clients loop until the time is up, each picking one of:
// - a charge with a fresh key, sent once, or re-sent afterwards (an answer the client never saw), or
//   sent two or three times at once (a double click, an impatient retry); a 409 is retried until it
//   settles, every 201 of one key must carry the same charge;
// - reads: the caller's photos, one stock level, a batch of stock levels.
// One more client refreshes the access token every 400 ms; everyone uses the newest one.
//
// Checked: not one 5xx (nor a dropped connection, nor any status outside 200/201/409), the count of
// charge rows equals the count of distinct keys sent (one row per key), and once the outbox relay has
// drained, each payment.succeeded event was applied exactly once by the receiver.
import { randomBytes, randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { listen } from '../src/listen.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow, tokenRequest } from './flow.js';
import { alice } from './test-idp.js';

const chaos = process.env.IDEM_CHAOS === '1';
const durationMs = chaos ? 60_000 : 8000;
const virtualClients = 6;
const refreshEveryMs = 400;
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const scope = 'openid profile email offline_access photos:read stock:read charges:write';

/** Says loudly that a service is missing; with CI=true that fails the run instead of skipping. */
function announce(what: string, ok: boolean): boolean {
  if (ok) return true;
  const message = `${what} is not reachable: the reference-app soak test is SKIPPED.`;
  if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
  console.warn(`\n!!! ${message}\n`);
  return false;
}

async function redisAnswers(): Promise<boolean> {
  const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 1500 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

async function postgresAnswers(): Promise<boolean> {
  try {
    const db = await openDatabase({ url: databaseUrl });
    try {
      await db.query('select 1');
      return true;
    } finally {
      await db.close();
    }
  } catch {
    return false;
  }
}

const available =
  announce(`PostgreSQL at ${databaseUrl}`, await postgresAnswers()) &&
  announce(`Redis at ${redisUrl}`, await redisAnswers());

/** One answer: status 0 when the connection failed or the client gave up. */
interface Answer {
  status: number;
  retryAfter: string | null;
  replayed: boolean;
  body: Record<string, unknown> | undefined;
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const pick = <T>(items: readonly T[]): T => items[Math.floor(Math.random() * items.length)] as T;

describe.runIf(available)('the reference app under mixed load (soak)', () => {
  const schema = `refapp_soak_${randomBytes(5).toString('hex')}`;
  const prefix = `refapp:soak:${randomBytes(5).toString('hex')}:`;
  let db: Database;
  let redis: Redis;
  let running: RunningReferenceApp;
  let stack: RunningResourceStack;
  let accessToken = '';
  let refreshToken = '';

  beforeAll(async () => {
    db = await openDatabase({ url: databaseUrl, schema });
    redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
    redis.on('error', () => undefined);
    await redis.connect();
    const gatewayPort = await listen(0);
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: gatewayPort.url });
    stack = await startResourceStack({
      db,
      gatewayPort,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: gatewayPort.url,
      authUrl: running.authUrl,
      // The background relay delivers while the load runs, as in production; the test drains the rest.
      relay: { pollInterval: '250ms' },
      redis: { client: redis, prefix },
    });
    const flow = await codeFlow(running.authUrl, running.clients.app, alice, { scope });
    expect(flow.tokens.status).toBe(200);
    accessToken = flow.tokens.body.access_token as string;
    refreshToken = flow.tokens.body.refresh_token as string;
    expect(refreshToken).toBeTruthy();
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
    await running?.close();
    if (db) {
      await db.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
      await db.close();
    }
    if (redis) {
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
        if (keys.length > 0) await redis.unlink(...keys);
        cursor = next;
      } while (cursor !== '0');
      redis.disconnect();
    }
  });

  it(`${durationMs / 1000} s of charges with retries, reads and token refreshes: no 5xx, one charge per key, each event applied once`, {
    timeout: durationMs + 120_000,
  }, async () => {
    const statuses = new Map<string, number>();
    const count = (route: string, status: number) => {
      const label = `${route} ${status}`;
      statuses.set(label, (statuses.get(label) ?? 0) + 1);
    };
    const unexpected: string[] = [];

    async function call(
      route: string,
      path: string,
      init: { method?: string; key?: string; json?: unknown } = {},
    ): Promise<Answer> {
      const headers: Record<string, string> = { authorization: `Bearer ${accessToken}` };
      if (init.key !== undefined) headers['idempotency-key'] = init.key;
      if (init.json !== undefined) headers['content-type'] = 'application/json';
      let answer: Answer;
      try {
        const response = await fetch(new URL(path, stack.gateway.url), {
          method: init.method ?? 'GET',
          headers,
          ...(init.json === undefined ? {} : { body: JSON.stringify(init.json) }),
          signal: AbortSignal.timeout(15_000),
        });
        const text = await response.text();
        answer = {
          status: response.status,
          retryAfter: response.headers.get('retry-after'),
          replayed: response.headers.get('idempotent-replayed') === 'true',
          body: text ? (JSON.parse(text) as Record<string, unknown>) : undefined,
        };
      } catch {
        answer = { status: 0, retryAfter: null, replayed: false, body: undefined };
      }
      count(route, answer.status);
      if (![200, 201, 409].includes(answer.status)) unexpected.push(`${route} -> ${answer.status}`);
      return answer;
    }

    const sentKeys = new Set<string>();
    const chargeOf = new Map<string, string>();
    const split = new Set<string>();
    let executions = 0;
    let replays = 0;
    let conflicts = 0;

    /** Sends one charge until it is no longer in flight elsewhere (409), as a client that retries. */
    async function sendCharge(key: string, amount: number): Promise<void> {
      for (let attempt = 0; attempt < 200; attempt++) {
        const answer = await call('POST /charges', '/charges', {
          method: 'POST',
          key: `"${key}"`,
          json: { amount, currency: 'EUR' },
        });
        if (answer.status === 409) {
          conflicts++;
          expect(answer.retryAfter).toMatch(/^\d+$/);
          // Sooner than Retry-After asks, to press harder on the in-flight window.
          await pause(25);
          continue;
        }
        if (answer.status !== 201) return;
        if (answer.replayed) replays++;
        else executions++;
        const id = String(answer.body?.id);
        const seen = chargeOf.get(key);
        if (seen === undefined) chargeOf.set(key, id);
        else if (seen !== id) split.add(key);
        return;
      }
      unexpected.push(`POST /charges "${key}" still in flight after 200 attempts`);
    }

    async function chargeWithRetries(): Promise<void> {
      const key = randomUUID();
      sentKeys.add(key);
      const amount = 100 + Math.floor(Math.random() * 9900);
      const shape = Math.random();
      if (shape < 0.4) {
        await sendCharge(key, amount);
      } else if (shape < 0.7) {
        // The answer never reached the client: it sends the same request again.
        await sendCharge(key, amount);
        await sendCharge(key, amount);
      } else {
        // Two or three copies at once: one runs, the others wait out the 409s and get the replay.
        await Promise.all(Array.from({ length: 2 + Math.floor(Math.random() * 2) }, () => sendCharge(key, amount)));
      }
    }

    const reads = [
      () => call('GET /photos', '/photos'),
      () => call('GET /stock', `/stock?item=item-${1 + Math.floor(Math.random() * 120)}`),
      () =>
        call('POST /stock/batch', '/stock/batch', {
          method: 'POST',
          json: { items: Array.from({ length: 10 }, () => `item-${1 + Math.floor(Math.random() * 120)}`) },
        }),
    ];

    const deadline = Date.now() + durationMs;
    let refreshes = 0;
    const refresher = async () => {
      while (Date.now() < deadline) {
        const refreshed = await tokenRequest(
          running.authUrl,
          { grant_type: 'refresh_token', refresh_token: refreshToken },
          running.clients.app,
        );
        count('POST /token', refreshed.status);
        if (refreshed.status !== 200) {
          unexpected.push(`POST /token -> ${refreshed.status} ${JSON.stringify(refreshed.body)}`);
          return;
        }
        // Rotation: the old refresh token is spent, the next refresh must use the new one.
        refreshToken = refreshed.body.refresh_token as string;
        accessToken = refreshed.body.access_token as string;
        refreshes++;
        await pause(refreshEveryMs);
      }
    };
    const client = async () => {
      while (Date.now() < deadline) {
        if (Math.random() < 0.45) await chargeWithRetries();
        else await pick(reads)();
      }
    };
    const started = performance.now();
    await Promise.all([refresher(), ...Array.from({ length: virtualClients }, client)]);
    const loadMs = performance.now() - started;

    // Drain the outbox: what the background relay has not delivered yet goes now. A row waiting out
    // its backoff is made due at once (the outbox reads the database clock), instead of waiting.
    const drainStarted = performance.now();
    for (let round = 0; round < 200; round++) {
      const { rows } = await db.query<{ n: number }>(
        "select count(*)::int as n from api_webhook_outbox where status = 'pending'",
      );
      if (rows[0]?.n === 0) break;
      await db.query("update api_webhook_outbox set next_attempt_at = now() where status = 'pending'");
      await stack.api.relayOnce();
    }
    const drainMs = performance.now() - drainStarted;

    const charges = await db.query<{ id: string; idempotency_key: string }>(
      'select id, idempotency_key from api_charges',
    );
    const outbox = await db.query<{ status: string; n: number; retried: number }>(
      'select status, count(*)::int as n, count(*) filter (where attempts > 1)::int as retried from api_webhook_outbox group by status',
    );
    const events = await db.query<{ id: string; charge_id: string; applied: number; deliveries: number }>(
      "select id, charge_id, applied, deliveries from receiver_events where type = 'payment.succeeded'",
    );
    const requests = [...statuses.values()].reduce((a, b) => a + b, 0);
    const fiveHundreds = [...statuses].filter(([label]) => /\s5\d\d$/.test(label)).reduce((a, [, n]) => a + n, 0);
    console.info(
      `[figures] soak reference-app ${JSON.stringify({
        durationMs: Math.round(loadMs),
        requests,
        ratePerSecond: Math.round((requests / loadMs) * 1000),
        statuses: Object.fromEntries([...statuses].sort()),
        keysSent: sentKeys.size,
        chargeRows: charges.rows.length,
        executions,
        replays,
        conflicts,
        refreshes,
        outbox: outbox.rows,
        eventsApplied: events.rows.length,
        appliedTwice: events.rows.filter((event) => event.applied > 1).length,
        redeliveries: events.rows.reduce((a, event) => a + event.deliveries - 1, 0),
        drainMs: Math.round(drainMs),
        fiveHundreds,
      })}`,
    );

    // The load really was mixed: charges, reads of every kind, and refreshes all happened.
    expect(sentKeys.size).toBeGreaterThan(20);
    expect(refreshes).toBeGreaterThan(3);
    for (const route of ['GET /photos', 'GET /stock', 'POST /stock/batch'])
      expect(statuses.get(`${route} 200`)).toBeGreaterThan(0);
    expect(fiveHundreds).toBe(0);
    expect(unexpected).toEqual([]);
    expect(split).toEqual(new Set());

    // One charge row per distinct key sent, whatever the retries; and the client saw that charge.
    expect(charges.rows.length).toBe(sentKeys.size);
    expect(new Set(charges.rows.map((row) => row.idempotency_key))).toEqual(sentKeys);
    expect(executions).toBe(sentKeys.size);
    for (const row of charges.rows) expect(chargeOf.get(row.idempotency_key)).toBe(row.id);

    // Every event delivered, and applied exactly once by the receiver.
    expect(outbox.rows.map((row) => [row.status, row.n])).toEqual([['delivered', sentKeys.size]]);
    expect(events.rows.length).toBe(sentKeys.size);
    expect(new Set(events.rows.map((event) => event.id))).toEqual(new Set(charges.rows.map((row) => `evt_${row.id}`)));
    for (const event of events.rows) expect(event.applied).toBe(1);
  });
});
