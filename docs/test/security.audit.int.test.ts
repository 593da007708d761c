// Audit of docs/security.md (and the security claims of docs/operations.md and the reference app's
// README) against behaviour: each test takes one sentence that states a security behaviour no other
// test pinned, and checks it on real servers (port 0), real Redis and PostgreSQL, injected clocks.

import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const securityPage = readFileSync(join(root, 'docs', 'security.md'), 'utf8');
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const run = `${process.pid}-${Date.now().toString(36)}`;

async function listen(app: express.Express): Promise<{ url: string; close(): Promise<void> }> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** The paragraph of security.md that holds `words`, joined into one line. */
function sentenceOf(words: string): string {
  const paragraph = securityPage.split(/\n\s*\n/).find((part) => part.replace(/\s+/g, ' ').includes(words));
  expect(paragraph, `security.md no longer says "${words}"`).toBeDefined();
  return (paragraph as string).replace(/\s+/g, ' ');
}

describe('docs/security.md, What is stored: per-request headers are never replayed, even if listed', () => {
  // "`Set-Cookie`, `Date`, `Cache-Control`, request-id, trace and rate-limit headers are never
  // replayed, even if you list them in `replayHeaders`." The list refused `x-ratelimit-*` and
  // `ratelimit*` but not `X-Rate-Limit-*` (Twitter's and many APIs' spelling), and of the trace
  // headers only `traceparent` and `tracestate`: `traceresponse` (W3C Trace Context level 2), AWS's
  // `X-Amzn-Trace-Id` and request ids, Google's `X-Cloud-Trace-Context`, Zipkin's B3, Jaeger's, Datadog's
  // and Sentry's, Cloudflare's `CF-Ray` were taken, stored and replayed: another request's quota and
  // trace handed to a retry.
  const perRequest = [
    'x-rate-limit-remaining',
    'X-Rate-Limit-Reset',
    'traceresponse',
    'x-amzn-trace-id',
    'x-amzn-requestid',
    'x-amz-request-id',
    'x-cloud-trace-context',
    'x-b3-traceid',
    'b3',
    'uber-trace-id',
    'x-datadog-trace-id',
    'sentry-trace',
    'baggage',
    'cf-ray',
  ];
  it.each(perRequest)('replayHeaders: [%s] is refused at construction, like x-request-id', (name) => {
    expect(() => idempotency({ store: memoryStore(), scope: () => 't', replayHeaders: ['x-request-id'] })).toThrow(
      TypeError,
    );
    expect(() => idempotency({ store: memoryStore(), scope: () => 't', replayHeaders: [name] })).toThrow(
      /replayHeaders must not include/,
    );
  });

  it('names that only look like them are still taken (the contrast)', () => {
    for (const name of ['x-rate-limiter-policy', 'x-trace-mode', 'b3-sampling-note', 'x-charge-version']) {
      expect(() => idempotency({ store: memoryStore(), scope: () => 't', replayHeaders: [name] })).not.toThrow();
    }
  });

  it('a handler that sets them anyway: the replay carries none of them', async () => {
    let runs = 0;
    const app = express();
    app.post('/charges', idempotency({ store: memoryStore(), scope: () => 'tenant-1' }), (_req, res) => {
      runs++;
      for (const name of perRequest) res.setHeader(name, `first-${runs}`);
      res.status(201).json({ id: 'ch_1' });
    });
    const server = await listen(app);
    try {
      const init = { method: 'POST', headers: { 'idempotency-key': '"k-1"' } };
      await fetch(`${server.url}/charges`, init);
      const replay = await fetch(`${server.url}/charges`, init);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      for (const name of perRequest) expect(replay.headers.get(name), name).toBeNull();
      expect(runs).toBe(1);
    } finally {
      await server.close();
    }
  });
});

describe('docs/security.md, Spoofed headers: what a response may carry from the request', () => {
  // "Nothing read from a request is echoed into a response: challenges and problem bodies come from
  // fixed tables, and a replay only carries allowlisted headers." Was wrong as written: every answer
  // that executes or replays echoes the request's `Idempotency-Key` (DESIGN's HTTP table, RFC draft),
  // and a replay carries `Idempotent-Replayed` and `Cache-Control` besides the allowlist. What holds is
  // narrower: the echo is the key as checked (visible ASCII, one field, at most 255 bytes), and a
  // refused key is never echoed.
  it('the first answer and the replay echo the checked key; a refused key is not echoed', async () => {
    const app = express();
    app.post('/charges', idempotency({ store: memoryStore(), scope: () => 'tenant-1' }), (_req, res) => {
      res.status(201).json({ id: 'ch_1' });
    });
    const server = await listen(app);
    try {
      const key = '"echo-\u0021me"';
      const first = await fetch(`${server.url}/charges`, { method: 'POST', headers: { 'idempotency-key': key } });
      const replay = await fetch(`${server.url}/charges`, { method: 'POST', headers: { 'idempotency-key': key } });
      expect(first.headers.get('idempotency-key')).toBe(key);
      expect(replay.headers.get('idempotency-key')).toBe(key);
      const bad = `"${'x'.repeat(300)}"`;
      const refused = await fetch(`${server.url}/charges`, { method: 'POST', headers: { 'idempotency-key': bad } });
      expect(refused.status).toBe(400);
      expect(refused.headers.get('idempotency-key')).toBeNull();
      expect(await refused.text()).not.toContain('xxxxxxxxxx');
    } finally {
      await server.close();
    }
    expect(sentenceOf('is echoed into a response')).toMatch(/except the `Idempotency-Key`/);
  });
});

// "Not stored: the request body, the query, the key itself, the caller's identity in clear, and
// per-request headers." Pinned for the core's fingerprint (packages/core/test/at-rest.audit.test.ts);
// here end to end, by reading everything each real store holds after a completed request.
const marker = {
  key: `"key-marker-${run}"`,
  body: `body-marker-${run}`,
  query: `query-marker-${run}`,
  caller: `caller-marker-${run}`,
  header: `header-marker-${run}`,
  token: `token-marker-${run}`,
};

async function completeOneRequest(store: Parameters<typeof idempotency>[0]['store']): Promise<string> {
  const app = express();
  app.post(
    '/charges',
    idempotency({ store, scope: () => `https://issuer.example|${marker.caller}`, storeTimeout: '15s' }),
    (_req, res) => {
      res.status(201).setHeader('x-request-id', 'r-1').json({ id: 'ch_1' });
    },
  );
  const server = await listen(app);
  try {
    const send = () =>
      fetch(`${server.url}/charges?note=${marker.query}`, {
        method: 'POST',
        headers: {
          'idempotency-key': marker.key,
          'content-type': 'application/json',
          authorization: `Bearer ${marker.token}`,
          'x-client-note': marker.header,
        },
        body: JSON.stringify({ note: marker.body }),
      });
    const first = await send();
    const replay = await send();
    expect(first.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    return await replay.text();
  } finally {
    await server.close();
  }
}

function expectNoRequestMarkers(atRest: string): void {
  expect(atRest).toContain('ch_1'); // the response body is stored: the contrast
  for (const [what, value] of Object.entries(marker)) {
    expect(atRest, `${what} at rest`).not.toContain(value.replaceAll('"', ''));
  }
}

describe('docs/security.md, What is stored: not the body, query, key, caller or request headers', async () => {
  const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the at-rest check on it');
  const withPostgres = serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    'the at-rest check on it',
  );

  const prefix = `audit-security:at-rest:${run}:`;
  const table = `audit_security_at_rest_${run.replaceAll('-', '_')}`;
  let client: Redis | undefined;
  let pool: pg.Pool | undefined;
  beforeAll(async () => {
    if (withRedis) client = new Redis(redisUrl);
    if (withPostgres) {
      pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
      pool.on('error', () => undefined);
      await migrate(pool, { table });
    }
  });
  afterAll(async () => {
    if (client) {
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      await client.quit();
    }
    if (pool) {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    }
  });

  it.runIf(withRedis)('Redis: every key under the prefix and every value holds none of the request', async () => {
    const redis = client as Redis;
    expect(await completeOneRequest(redisStore({ client: redis, prefix }))).toContain('ch_1');
    const keys = await redis.keys(`${prefix}*`);
    expect(keys.length).toBeGreaterThan(0);
    let atRest = '';
    for (const key of keys) {
      const type = await redis.type(key);
      const value =
        type === 'hash'
          ? Object.entries(await redis.hgetallBuffer(key))
              .map(([field, bytes]) => `${field}=${bytes.toString('latin1')}`)
              .join('\n')
          : ((await redis.getBuffer(key))?.toString('latin1') ?? '');
      atRest += `${key}\n${value}\n`;
    }
    expectNoRequestMarkers(atRest);
  });

  it.runIf(withPostgres)('PostgreSQL: every column of every row holds none of the request', async () => {
    const db = pool as pg.Pool;
    expect(await completeOneRequest(postgresStore({ client: db, table }))).toContain('ch_1');
    const { rows } = await db.query<{ row: string }>(
      `SELECT id || ' ' || token || ' ' || fingerprint || ' ' || coalesce(headers::text, '') || ' ' ||
              coalesce(convert_from(body, 'UTF8'), '') AS row FROM "${table}"`,
    );
    expect(rows).toHaveLength(1);
    expectNoRequestMarkers(rows.map((r) => r.row).join('\n'));
  });
});
