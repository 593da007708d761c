// Audit of docs/security.md (and the security claims of docs/operations.md and the reference app's
// README) against behaviour: each test takes one sentence that states a security behaviour no other
// test pinned, and checks it on real servers (port 0), real Redis and PostgreSQL, injected clocks.

import * as dns from 'node:dns';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import * as net from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import * as webhooks from '@idem/webhooks';
import { createReceiver, createSigner, expressWebhook } from '@idem/webhooks';
import express from 'express';
import { Redis } from 'ioredis';
import pg from 'pg';
import ts from 'typescript';
import * as undici from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLoginThrottle } from '../../examples/reference-app/src/idp/login-throttle.js';
import { createIdp } from '../../examples/reference-app/src/idp/server.js';
import { type ListeningPort, listen as listenPort } from '../../examples/reference-app/src/listen.js';
import { openLoginForm } from '../../examples/reference-app/test/flow.js';
import { startIdpBehindProxy, startWholeStack, type WholeStack } from '../../examples/reference-app/test/test-stack.js';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const securityPage = readFileSync(join(root, 'docs', 'security.md'), 'utf8');
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const run = `${process.pid}-${Date.now().toString(36)}`;

/** Serves `app` on port 0 for as long as `use` runs, then closes it. */
async function withServer<T>(app: express.Express, use: (url: string) => Promise<T>): Promise<T> {
  const server = await listen(createServer(app));
  try {
    return await use(server.url);
  } finally {
    await server.close();
  }
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
    await withServer(app, async (url) => {
      const init = { method: 'POST', headers: { 'idempotency-key': '"k-1"' } };
      await fetch(`${url}/charges`, init);
      const replay = await fetch(`${url}/charges`, init);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      for (const name of perRequest) expect(replay.headers.get(name), name).toBeNull();
      expect(runs).toBe(1);
    });
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
    await withServer(app, async (url) => {
      const key = '"echo-\u0021me"';
      const first = await fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': key } });
      const replay = await fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': key } });
      expect(first.headers.get('idempotency-key')).toBe(key);
      expect(replay.headers.get('idempotency-key')).toBe(key);
      const bad = `"${'x'.repeat(300)}"`;
      const refused = await fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': bad } });
      expect(refused.status).toBe(400);
      expect(refused.headers.get('idempotency-key')).toBeNull();
      expect(await refused.text()).not.toContain('xxxxxxxxxx');
    });
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
  return withServer(app, async (url) => {
    const send = () =>
      fetch(`${url}/charges?note=${marker.query}`, {
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
  });
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

  // The stored-data table's webhook row: "the same record per event id; the stored response is the
  // receiver's own acknowledgement, not the event". And "A delivery that fails verification is never
  // recorded": a forged delivery of a real event id leaves nothing, and the genuine one is applied.
  it.runIf(withRedis)(
    'Redis: a webhook receiver keeps its acknowledgement, not the event; a forgery leaves nothing',
    async () => {
      const redis = client as Redis;
      const hookPrefix = `${prefix}webhook:`;
      const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
      const applied: string[] = [];
      const receiver = createReceiver({
        store: redisStore({ client: redis, prefix: hookPrefix }),
        secret,
        apply: (event) => void applied.push(event.body.toString()),
      });
      const app = express();
      app.post('/hooks', expressWebhook(receiver));
      await withServer(app, async (url) => {
        const id = `msg_${run}`;
        const body = JSON.stringify({ type: 'payment.succeeded', note: marker.body });
        const deliver = (headers: Record<string, string>, sent: string) =>
          fetch(`${url}/hooks`, {
            method: 'POST',
            headers: { ...headers, 'content-type': 'application/json' },
            body: sent,
          });
        const genuine = createSigner({ secret }).sign({ id, body, timestamp: new Date() });
        const forger = createSigner({ secret: 'whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=' });
        const forged = await deliver(
          forger.sign({ id, body: '{"type":"forged"}', timestamp: new Date() }),
          '{"type":"forged"}',
        );
        expect(forged.status).toBe(400);
        expect(await redis.keys(`${hookPrefix}*`)).toEqual([]);
        const tampered = await deliver(genuine, body.replace('succeeded', 'refunded'));
        expect(tampered.status).toBe(400);
        expect(await redis.keys(`${hookPrefix}*`)).toEqual([]);
        expect((await deliver(genuine, body)).status).toBeLessThan(300);
        expect(applied).toEqual([body]);
        const keys = await redis.keys(`${hookPrefix}*`);
        expect(keys.length).toBeGreaterThan(0);
        let atRest = '';
        for (const key of keys) atRest += `${key}\n${(await redis.getBuffer(key))?.toString('latin1') ?? ''}\n`;
        expect(atRest).not.toContain(marker.body);
        expect(atRest).not.toContain('payment.succeeded');
        expect(atRest).not.toContain(id);
      });
    },
  );

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

describe('examples/reference-app/README.md, password guessing behind a proxy (TRUST_PROXY=1)', () => {
  // "after 10 wrong passwords for one name from one address within 15 minutes, that name and address
  // get 429 ... Keyed by ... the address (`TRUST_PROXY=1` takes it from `X-Forwarded-For`)". Was
  // wrong: TRUST_PROXY=1 set Express's `trust proxy` to true, which trusts every hop and takes the
  // left-most address of X-Forwarded-For, the one the client wrote. Proxies append the address they
  // saw to the client's header (nginx's $proxy_add_x_forwarded_for, AWS ALB, Heroku), so a client that
  // sent another X-Forwarded-For with each guess started a fresh count each time: no limit at all on
  // guessing one account's password. One trusted proxy means the last address, the one it appended.
  let whole: WholeStack;
  let proxied: ListeningPort;
  let small: ListeningPort;

  beforeAll(async () => {
    whole = await startWholeStack('security_audit');
    proxied = await startIdpBehindProxy(whole);
    // The throttle follows at most `maxEntries` pairs (10,000 by default): 3 here, so that filling it
    // takes three requests rather than ten thousand.
    small = await listenPort(0);
    const bounded = await createIdp({
      db: whole.db,
      issuer: small.url,
      resource: whole.stack.gateway.baseUrl,
      loginThrottle: { maxEntries: 3 },
    });
    small.use(bounded.app);
  }, 120_000);

  afterAll(async () => {
    await small?.close();
    await proxied?.close();
    await whole?.close();
  });

  it('a client that forges a new X-Forwarded-For on every guess is refused from the eleventh', async () => {
    const { agent, action, csrf } = await openLoginForm(proxied.url, whole.running.clients.app);
    const statuses: number[] = [];
    for (let guess = 0; guess < 12; guess++) {
      // What the proxy passes on: the client's own header, then the address it saw.
      const answer = await agent.postForm(
        action,
        { csrf, username: 'bob', password: `guess-${guess}` },
        { 'x-forwarded-for': `203.0.113.${guess}, 198.51.100.7` },
      );
      statuses.push(answer.response.status);
    }
    expect(statuses).toEqual([...Array(10).fill(200), 429, 429]);
    // Another client behind the same proxy is another address: not locked out (the contrast).
    const other = await agent.postForm(
      action,
      { csrf, username: 'bob', password: 'guess-other' },
      { 'x-forwarded-for': '198.51.100.8' },
    );
    expect(other.response.status).toBe(200);
  });

  // "... that name and address get 429 ... and no password is checked until the oldest failure is 15
  // minutes old." Was wrong once the throttle's memory was full: it forgot the pair quiet the longest,
  // and a locked pair is quiet by construction (a refused guess is no failure), so it was the first to
  // go. Anyone, from any address, who made `maxEntries` failures under other names (10,000 by default,
  // about a minute of argon2 on four threads) unlocked the account for ten more guesses: about ten a
  // minute instead of ten per quarter hour. A locked pair now goes last.
  it('a locked name and address stay locked while the throttle forgets other pairs to make room', async () => {
    const { agent, action, csrf } = await openLoginForm(small.url, whole.running.clients.app);
    const guess = async (username: string, password: string) =>
      (await agent.postForm(action, { csrf, username, password })).response.status;
    const statuses: number[] = [];
    for (let n = 0; n < 11; n++) statuses.push(await guess('bob', `guess-${n}`));
    expect(statuses).toEqual([...Array(10).fill(200), 429]);
    // Three failures under other names fill the throttle's memory (bob's pair and three more).
    for (const name of ['flood-1', 'flood-2', 'flood-3']) expect(await guess(name, 'x')).toBe(200);
    expect(await guess('bob', 'guess-11')).toBe(429);
    // The memory stays bounded: an unlocked pair was forgotten instead (the contrast).
    expect(await guess('flood-1', 'x')).toBe(200);
  });

  it('the throttle itself: it forgets an unlocked pair first, and never the pair that just failed', () => {
    let now = Date.UTC(2026, 0, 1);
    const clocked = (maxEntries: number) => createLoginThrottle({ maxFailures: 2, maxEntries, now: () => now });
    const failing =
      (throttle: ReturnType<typeof createLoginThrottle>) =>
      (name: string, times = 1) => {
        for (let i = 0; i < times; i++) {
          throttle.failed(name, 'x');
          now += 1;
        }
      };
    const throttle = clocked(3);
    const fail = failing(throttle);
    fail('locked-1', 2);
    fail('open-1');
    fail('locked-2', 2);
    fail('new');
    // Full (three pairs) when `new` came: the unlocked `open-1` went, though `locked-1` was quieter.
    expect(throttle.retryAfter('locked-1', 'x')).toBeGreaterThan(0);
    expect(throttle.retryAfter('locked-2', 'x')).toBeGreaterThan(0);
    // Every other pair locked: the one that just failed is still counted (the quietest locked one goes).
    const full = clocked(2);
    const failFull = failing(full);
    failFull('a', 2);
    failFull('b', 2);
    failFull('victim', 2);
    expect(full.retryAfter('victim', 'x')).toBeGreaterThan(0);
  });
});

describe('docs/security.md, Outgoing webhooks: the recipe that refuses private addresses', () => {
  // "Refuse private addresses when the connection is made ... an agent whose DNS lookup refuses
  // private, loopback and link-local addresses, plus a check of IP literals in the URL.
  // [webhooks](webhooks.md#sending) has the code." The code (run as printed below, as
  // packages/webhooks/test/ssrf-recipe.audit.test.ts runs it) let through every IPv6 address that
  // carries an IPv4 one to a private network: NAT64 (`64:ff9b::/96`, RFC 6052, and the local-use
  // `64:ff9b:1::/48`, RFC 8215: on an IPv6-only host behind a NAT64 gateway, such as an AWS NAT
  // gateway, `64:ff9b::a00:1` is 10.0.0.1), 6to4 (`2002::/16`, deprecated by RFC 7526) and the
  // deprecated IPv4-compatible `::/96`. A name whose AAAA record is one of them reached the network
  // the recipe exists to keep out.
  function recipeIsPrivate(): (address: string) => boolean {
    const page = readFileSync(join(root, 'docs', 'webhooks.md'), 'utf8');
    const section = page.slice(page.indexOf('**Endpoint URLs you did not choose (SSRF).**'));
    const block = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
    expect(block, 'the recipe block').toBeDefined();
    const js = ts.transpileModule(`${block}\nmodule.exports = { isPrivate };`, {
      compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const modules: Record<string, unknown> = { 'node:dns': dns, 'node:net': net, undici, '@idem/webhooks': webhooks };
    const module = { exports: {} as { isPrivate: (address: string) => boolean } };
    const require = (name: string) => modules[name];
    const env = { env: { WEBHOOK_SIGNING_SECRET: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' } };
    new Function('require', 'module', 'exports', 'process', js)(require, module, module.exports, env);
    return module.exports.isPrivate;
  }

  it.each([
    ['64:ff9b::a00:1', 'NAT64 of 10.0.0.1'],
    ['64:ff9b::a9fe:a9fe', 'NAT64 of 169.254.169.254'],
    ['64:ff9b::7f00:1', 'NAT64 of 127.0.0.1'],
    ['64:ff9b:1::a00:1', 'local-use NAT64 of 10.0.0.1'],
    ['2002:a00:1::1', '6to4 of 10.0.0.1'],
    ['2002:a9fe:a9fe::1', '6to4 of 169.254.169.254'],
    ['::a9fe:a9fe', 'IPv4-compatible 169.254.169.254'],
    ['::ffff:a00:1', 'IPv4-mapped 10.0.0.1 (the contrast: refused before)'],
  ])('refuses %s (%s)', (address) => {
    expect(recipeIsPrivate()(address)).toBe(true);
  });

  it('still lets public addresses through, IPv6 and IPv4 alike, and NAT64 of a public one (IPv6-only hosts)', () => {
    const isPrivate = recipeIsPrivate();
    const publicOnes = ['93.184.216.34', '2606:2800:220:1:248:1893:25c8:1946', '2a00:1450:4001:80b::200e'];
    for (const address of [...publicOnes, '64:ff9b::5db8:d822', '64:ff9b::93.184.216.34']) {
      expect(isPrivate(address), address).toBe(false);
    }
  });
});
