// Audit of docs/migrating.md, "From a hand-rolled Stripe-style table": each claim the section makes
// about idem, on real Express servers over the memory store (with an injected clock where the
// retention matters) and over the real PostgreSQL for the After block's settings and the cut-over
// bridge, which is the page's own `oldKeys` compiled from its block. What the page says of Stripe is
// cited to research/idempotency-anchors.md and is not run. Each row of the section's "Behaviour
// differences that matter" table is named by the test that observes it; the last test of that
// group checks none is left unobserved.
import http from 'node:http';
import { memoryStore, type OutcomePolicy } from '@idem/core';
import { idempotency, idempotencyErrors } from '@idem/express';
import { migrate, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import pg from 'pg';
import ts from 'typescript';
import { afterAll, describe, expect, it } from 'vitest';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';
import { migratingSection } from './migrating-section.js';

const heading = 'From a hand-rolled Stripe-style table';
const { section, differences, differenceRows, differenceRow, optionRow, observed } = migratingSection(heading);
/** A `ts` block of the section, found by a line it contains. */
function blockWith(needle: string): string {
  for (const match of section().matchAll(/^```ts[^\n]*\n([\s\S]*?)^```\s*$/gm)) {
    if ((match[1] as string).includes(needle)) return match[1] as string;
  }
  throw new Error(`"${heading}" has no ts block with ${needle}`);
}

const closers: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const close of closers) await close();
});
async function serve(app: express.Express): Promise<string> {
  const { url, close } = await listen(http.createServer(app));
  closers.push(close);
  return url;
}

type Options = Parameters<typeof idempotency>[0];
/** POST /charges and POST /refunds behind `idempotency()`, mounted app-wide; `runs` counts handler runs. */
function charges(options: Partial<Options>, handler?: express.RequestHandler) {
  const counter = { runs: 0 };
  const app = express();
  app.use(idempotency({ store: memoryStore(), scope: () => 'acct_1', ...options }));
  app.use(express.json());
  const answer: express.RequestHandler =
    handler ??
    ((_req, res) => {
      res.status(201).json({ id: `ch_${counter.runs}` });
    });
  app.post(['/charges', '/refunds'], (req, res, next) => {
    counter.runs++;
    return answer(req, res, next);
  });
  app.use(idempotencyErrors());
  return { app, counter };
}

const post = (url: string, key: string | undefined, body: unknown = { amount: 100 }) =>
  fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }) },
    body: JSON.stringify(body),
  });

describe('docs/migrating.md, From a hand-rolled Stripe-style table: behaviour differences', () => {
  it('same key, other parameters: 422 fingerprint_mismatch by default, 400 idempotency_error with mismatchStatus: 400', async () => {
    for (const [mismatchStatus, code] of [
      [undefined, 'fingerprint_mismatch'],
      [400, 'idempotency_error'],
    ] as const) {
      const { app, counter } = charges(mismatchStatus === undefined ? {} : { mismatchStatus });
      const url = `${await serve(app)}/charges`;
      expect((await post(url, 'k1')).status).toBe(201);
      const other = await post(url, 'k1', { amount: 200 });
      expect(other.status).toBe(mismatchStatus ?? 422);
      expect(other.headers.get('content-type')).toBe('application/problem+json');
      expect(await other.json()).toMatchObject({ code });
      expect(counter.runs).toBe(1);
    }
    expect(differenceRow('Same key, other parameters')).toMatch(/400 `idempotency_error` with `mismatchStatus: 400`/);
    expect(optionRow('400 `idempotency_error` for other parameters')).toMatch(/`mismatchStatus: 400`/);
  });

  it('same key, another endpoint: another record when mounted app-wide; on a route, another path of its template is refused', async () => {
    const { app, counter } = charges({ mismatchStatus: 400 });
    const base = await serve(app);
    expect((await post(`${base}/charges`, 'k2')).status).toBe(201);
    expect((await post(`${base}/refunds`, 'k2')).status).toBe(201);
    expect(counter.runs).toBe(2);

    let runs = 0;
    const perRoute = express();
    perRoute.post(
      '/charges/:id',
      idempotency({ store: memoryStore(), scope: () => 'acct_1', mismatchStatus: 400 }),
      (_req, res) => {
        runs++;
        res.status(201).json({});
      },
    );
    const routed = await serve(perRoute);
    expect((await post(`${routed}/charges/1`, 'k2')).status).toBe(201);
    const other = await post(`${routed}/charges/2`, 'k2');
    expect(other.status).toBe(400);
    expect(await other.json()).toMatchObject({ code: 'idempotency_error' });
    expect(runs).toBe(1);
    expect(differenceRow('Same key, another endpoint')).toMatch(/another path is another record, and the request runs/);
  });

  it('a concurrent request: 409 in_progress with Retry-After: 1, problem+json', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const { app, counter } = charges({}, async (_req, res) => {
      await gate;
      res.status(201).json({ id: 'ch_1' });
    });
    const url = `${await serve(app)}/charges`;
    const first = post(url, 'k3');
    while (counter.runs === 0) await new Promise((resolve) => setImmediate(resolve));
    const second = await post(url, 'k3');
    expect(second.status).toBe(409);
    expect(second.headers.get('retry-after')).toBe('1');
    expect(second.headers.get('content-type')).toBe('application/problem+json');
    expect(await second.json()).toMatchObject({ code: 'in_progress' });
    release();
    expect((await first).status).toBe(201);
    expect(differenceRow('A concurrent request')).toMatch(/409 `in_progress` with `Retry-After: 1`/);
  });

  it('"abc" and abc are one key; with strictKeys, abc is 400 key_invalid', async () => {
    const { app, counter } = charges({});
    const url = `${await serve(app)}/charges`;
    expect((await post(url, '"abc"')).status).toBe(201);
    const bare = await post(url, 'abc');
    expect(bare.status).toBe(201);
    expect(bare.headers.get('idempotent-replayed')).toBe('true');
    expect(counter.runs).toBe(1);

    const strict = charges({ strictKeys: true });
    const strictUrl = `${await serve(strict.app)}/charges`;
    const refused = await post(strictUrl, 'abc');
    expect(refused.status).toBe(400);
    expect(await refused.json()).toMatchObject({ code: 'key_invalid' });
    expect((await post(strictUrl, '"abc"')).status).toBe(201);
    expect(differenceRow('`"abc"` and `abc`')).toMatch(/one key \(with `strictKeys`, `abc` is 400 `key_invalid`\)/);
    expect(optionRow('the header value, compared as it came')).toMatch(/`"abc"` and `abc` are one key/);
  });

  it('a bare key with a space, a comma or a semicolon is 400 key_invalid; quoted, a space is fine; 255 bytes at most', async () => {
    const { app, counter } = charges({});
    const url = `${await serve(app)}/charges`;
    for (const key of ['order 42', 'a,b', 'a;b', 'a\\b']) {
      const answer = await post(url, key);
      expect(answer.status, key).toBe(400);
      expect(await answer.json()).toMatchObject({ code: 'key_invalid' });
    }
    // A non-ASCII key, sent as the latin-1 byte Node's client writes (fetch's Headers refuses it).
    const nonAscii = await new Promise<number>((resolve, reject) => {
      const target = new URL(url);
      const request = http.request(
        { host: target.hostname, port: target.port, path: target.pathname, method: 'POST' },
        (response) => {
          response.resume();
          resolve(response.statusCode ?? 0);
        },
      );
      request.on('error', reject);
      request.setHeader('idempotency-key', 'caf\u00e9');
      request.setHeader('content-type', 'application/json');
      request.end('{}');
    });
    expect(nonAscii).toBe(400);
    expect((await post(url, '"order 42"')).status).toBe(201);
    expect((await post(url, 'k'.repeat(255))).status).toBe(201);
    expect((await post(url, 'k'.repeat(256))).status).toBe(400);
    expect(counter.runs).toBe(2);
    expect(differenceRow('A key with a space, `,` or `;`, sent bare')).toMatch(/400 `key_invalid`/);
    expect(optionRow('keys of up to 255 characters')).toMatch(/or a non-ASCII character is 400 `key_invalid`/);
    expect(optionRow('keys of up to 255 characters')).toMatch(/quoted \(`"order 42"`\) it may hold spaces/);
  });

  it("a thrown handler under 'stripe' is released (the retry runs); under 'all' the error handler's 500 is saved", async () => {
    for (const [storeOutcome, runs] of [
      ['stripe', 2],
      ['all', 1],
    ] as const) {
      const { app, counter } = charges({ storeOutcome }, () => {
        throw new Error('card network down');
      });
      const url = `${await serve(app)}/charges`;
      expect((await post(url, 'k4')).status).toBe(500);
      const retry = await post(url, 'k4');
      expect(retry.status).toBe(500);
      expect(counter.runs, storeOutcome).toBe(runs);
      if (storeOutcome === 'all') expect(retry.headers.get('idempotent-replayed')).toBe('true');
    }
    expect(differenceRow('A handler that throws')).toMatch(/under `'stripe'`, released: the retry runs/);
  });

  it("under 'stripe' a returned 500 is saved; a handler's 400 is saved unless it calls release()", async () => {
    const returned = charges({ storeOutcome: 'stripe' }, (_req, res) => {
      res.status(500).json({ error: 'declined later' });
    });
    const returnedUrl = `${await serve(returned.app)}/charges`;
    await post(returnedUrl, 'k5');
    expect((await post(returnedUrl, 'k5')).headers.get('idempotent-replayed')).toBe('true');
    expect(returned.counter.runs).toBe(1);

    const validation = charges({ storeOutcome: 'stripe' }, (_req, res) => {
      res.status(400).json({ error: { type: 'invalid_request_error' } });
    });
    const validationUrl = `${await serve(validation.app)}/charges`;
    await post(validationUrl, 'k6');
    expect((await post(validationUrl, 'k6')).headers.get('idempotent-replayed')).toBe('true');
    expect(validation.counter.runs).toBe(1);

    const released = charges({ storeOutcome: 'stripe' }, (req, res) => {
      req.idempotency?.release();
      res.status(400).json({ error: { type: 'invalid_request_error' } });
    });
    const releasedUrl = `${await serve(released.app)}/charges`;
    await post(releasedUrl, 'k7');
    const retry = await post(releasedUrl, 'k7');
    expect(retry.status).toBe(400);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(released.counter.runs).toBe(2);
    expect(differenceRow('A validation 400 from the handler')).toMatch(/unless the handler calls `release\(\)`/);
    expect(optionRow('saved once the endpoint began')).toMatch(/`storeOutcome: 'stripe'`/);
  });

  it("a body parser's refusal is never saved, whatever the policy", async () => {
    const { app, counter } = charges({ storeOutcome: 'stripe' });
    const url = `${await serve(app)}/charges`;
    const malformed = () =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k8' },
        body: '{',
      });
    expect((await malformed()).status).toBe(400);
    expect((await post(url, 'k8')).status).toBe(201);
    expect(counter.runs).toBe(1);
    expect(optionRow('validation errors not saved')).toMatch(/A body parser's refusal is never saved/);
  });

  it("401 and 429 are not saved under 'stripe'; 'all' releases 403 too, where 'stripe' saves it", async () => {
    for (const status of [401, 429, 403]) {
      for (const storeOutcome of ['stripe', 'all'] as const) {
        const { app, counter } = charges({ storeOutcome }, (_req, res) => {
          res.status(status).json({});
        });
        const url = `${await serve(app)}/charges`;
        await post(url, 'k9');
        await post(url, 'k9');
        const saved = status === 403 && storeOutcome === 'stripe';
        expect(counter.runs, `${status} ${storeOutcome}`).toBe(saved ? 1 : 2);
      }
    }
    expect(differenceRow('401 and 429')).toMatch(/not saved under `'stripe'` \(nor `'all'`, which releases 403 too\)/);
  });

  it('a crash mid-request: after one lease (10 s) a retry of the same request runs; another request is refused', async () => {
    let now = Date.UTC(2026, 0, 1);
    const store = memoryStore({ now: () => now });
    let hang = true;
    const { app, counter } = charges({ store, now: () => now, heartbeat: false, mismatchStatus: 400 }, (_req, res) => {
      if (hang) return; // the instance "crashed": nothing answers, nothing renews
      res.status(201).json({ id: 'ch_2' });
    });
    const url = `${await serve(app)}/charges`;
    const lost = post(url, 'k10').catch(() => undefined);
    while (counter.runs === 0) await new Promise((resolve) => setImmediate(resolve));
    hang = false;
    expect((await post(url, 'k10')).status).toBe(409);
    now += 10_001;
    expect((await post(url, 'k10', { amount: 999 })).status).toBe(400);
    expect((await post(url, 'k10')).status).toBe(201);
    expect(counter.runs).toBe(2);
    void lost;
    expect(differenceRow('A crash mid-request')).toMatch(/once one lease \(10 s\) has passed/);
  });

  it('a key reused after the 24 h retention runs as new; before it, the first response is replayed', async () => {
    let now = Date.UTC(2026, 0, 1);
    const store = memoryStore({ now: () => now });
    const { app, counter } = charges({ store, now: () => now, retention: '24h' });
    const url = `${await serve(app)}/charges`;
    const first = await post(url, 'k11');
    expect(first.headers.get('cache-control')).toBe('no-store');
    now += 24 * 3600_000 - 1_000;
    const replay = await post(url, 'k11');
    expect(replay.status).toBe(201);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('cache-control')).toBe('no-store');
    expect(replay.headers.get('idempotency-key')).toBe('k11');
    expect(await replay.json()).toEqual({ id: 'ch_1' });
    now += 2_000;
    expect((await post(url, 'k11')).headers.get('idempotent-replayed')).toBeNull();
    expect(counter.runs).toBe(2);
    expect(section()).toMatch(/a key reused after 24 h runs as new/);
    expect(optionRow('`Idempotent-Replayed: true` on a replay')).toMatch(
      /`Cache-Control: no-store`, and the key echoed/,
    );
    expect(() => idempotency({ store: memoryStore(), retention: '12h' })).toThrow(TypeError);
    expect(optionRow('keys pruned after 24 h')).toMatch(/Below 24 h needs `acknowledgeShortRetention: true`/);
  });

  it('the key is scoped to the account: two accounts with one key never share a record', async () => {
    let runs = 0;
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: (req) => req.get('x-account') }));
    app.post('/charges', (req, res) => {
      runs++;
      res.status(201).json({ account: req.get('x-account') });
    });
    const url = `${await serve(app)}/charges`;
    for (const account of ['acct_a', 'acct_b']) {
      const answer = await fetch(url, { method: 'POST', headers: { 'idempotency-key': 'k12', 'x-account': account } });
      expect(await answer.json()).toEqual({ account });
    }
    expect(runs).toBe(2);
    const none = await fetch(url, { method: 'POST', headers: { 'idempotency-key': 'k12' } });
    expect(none.status).toBe(500);
    expect(await none.json()).toMatchObject({ code: 'scope_missing' });
    expect(optionRow('the account column of the unique index')).toMatch(/500 `scope_missing`/);
  });

  it('"5xx not saved": the policy of the options table saves a 4xx, releases a 5xx and a throw', async () => {
    const cell = optionRow('5xx not saved').split('|')[2] ?? '';
    const source = /`storeOutcome: (.+?)`/.exec(cell)?.[1];
    expect(source).toBeDefined();
    const policy = new Function(`return ${source}`)() as Exclude<OutcomePolicy, string>;
    expect(policy({ status: 402 })).toBe(true);
    expect(policy({ status: 201 })).toBe(true);
    expect(policy({ status: 500 })).toBe(false);
    expect(policy({ status: 429 })).toBe(false);
    expect(policy({ status: 201, thrown: true })).toBe(false);
  });

  it('every behaviour difference of the section but the cut-over one is observed above', () => {
    const rows = differenceRows();
    // The last row is observed by the bridge tests over PostgreSQL below.
    expect(new Set(rows.filter((row) => row !== 'Retries of requests the old table saw'))).toEqual(observed);
  });
});

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the Stripe-style migration audit on PostgreSQL',
);

describe.skipIf(!withPostgres)('docs/migrating.md, From a hand-rolled Stripe-style table: over PostgreSQL', () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
  pool.on('error', () => {});
  const suffix = `${process.pid}_${Date.now()}`;
  const idemTable = `idem_stripe_audit_${suffix}`;
  // The page's Before table, under its name in a schema of its own (the bridge names it unqualified).
  const schema = `stripe_audit_${suffix}`;
  afterAll(async () => {
    await pool.query(`drop table if exists ${idemTable}`);
    await pool.query(`drop schema if exists ${schema} cascade`);
    await pool.end();
  });

  /** The page's `oldKeys`, compiled from its block, with `accountOf` reading an `x-account` header. */
  function oldKeys(db: pg.Pool): express.RequestHandler {
    const block = blockWith('export function oldKeys(');
    const fn = block.slice(block.indexOf('export function oldKeys')).replace(/^export /, '');
    const js = ts.transpileModule(`${fn}\nreturn oldKeys;`, {
      compilerOptions: { target: ts.ScriptTarget.ES2023 },
    }).outputText;
    const accountOf = (req: express.Request) => req.get('x-account');
    return new Function('accountOf', js)(accountOf)(db);
  }

  /** The After block's idempotency() settings, read from the page, over PostgreSQL. */
  function afterOptions(): Partial<Options> {
    const block = blockWith('storeOutcome:');
    const setting = (name: string) => new RegExp(`^\\s+${name}: (.+?),`, 'm').exec(block)?.[1];
    expect(setting('mismatchStatus')).toBe('400');
    expect(setting('storeOutcome')).toBe("'stripe'");
    expect(setting('retention')).toBe("'24h'");
    return { mismatchStatus: 400, storeOutcome: 'stripe', retention: '24h' };
  }

  it("the After block's settings over PostgreSQL; the bridge answers the old table's keys and passes the others to idem", async () => {
    await migrate(pool, { table: idemTable });
    await pool.query(`create schema ${schema}`);
    await pool.query(`create table ${schema}.idempotency_keys (
      account_id text not null, idempotency_key text not null,
      request_path text not null, request_params jsonb not null,
      locked_at timestamptz, response_code int, response_body text,
      created_at timestamptz not null default now(),
      primary key (account_id, idempotency_key))`);
    await pool.query(
      `insert into ${schema}.idempotency_keys (account_id, idempotency_key, request_path, request_params, locked_at, response_code, response_body)
       values ('acct_1', 'done', '/charges', '{}', null, 201, '{"id":"ch_old"}'),
              ('acct_1', 'running', '/charges', '{}', now(), null, null),
              ('acct_1', '"quoted"', '/charges', '{}', null, 201, '{"id":"ch_quoted"}')`,
    );
    // The bridge's query names the table unqualified, as the page does: its own pool, on the schema.
    const bridgePool = new pg.Pool({ connectionString: databaseUrl, max: 2, options: `-c search_path=${schema}` });
    bridgePool.on('error', () => {});
    closers.push(() => bridgePool.end());

    let runs = 0;
    const app = express();
    app.use(oldKeys(bridgePool));
    app.use(
      idempotency({
        store: postgresStore({ client: pool, table: idemTable }),
        scope: (req) => req.get('x-account'),
        ...afterOptions(),
      }),
    );
    app.use(express.json());
    app.post('/charges', (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_new_${runs}` });
    });
    const url = `${await serve(app)}/charges`;
    const send = (key: string, body: unknown = { amount: 100 }) =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-account': 'acct_1' },
        body: JSON.stringify(body),
      });

    // A key the old table saved: its response, replayed, whatever the body; the handler never runs.
    const done = await send('done', { amount: 999 });
    expect(done.status).toBe(201);
    expect(done.headers.get('idempotent-replayed')).toBe('true');
    expect(await done.json()).toEqual({ id: 'ch_old' });
    // One an old instance is still running: 409 with Retry-After.
    const running = await send('running');
    expect(running.status).toBe(409);
    expect(running.headers.get('retry-after')).toBe('1');
    expect(runs).toBe(0);
    // The old table holds the header value as sent: "quoted" is answered from it, bare quoted goes to idem.
    expect(await (await send('"quoted"')).json()).toEqual({ id: 'ch_quoted' });
    expect(await (await send('quoted')).json()).toEqual({ id: 'ch_new_1' });
    // A key the old code never saw: idem's, with the After block's settings.
    expect((await send('new')).status).toBe(201);
    const replay = await send('new');
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.json()).toEqual({ id: 'ch_new_2' });
    const mismatch = await send('new', { amount: 1 });
    expect(mismatch.status).toBe(400);
    expect(await mismatch.json()).toMatchObject({ code: 'idempotency_error' });
    expect(runs).toBe(2);
    // Nothing was written to the old table.
    expect((await pool.query(`select count(*)::int as n from ${schema}.idempotency_keys`)).rows[0].n).toBe(3);

    expect(differences()).toMatch(
      /\| Retries of requests the old table saw \| replayed \| not known to idem: run again unless the \[bridge\]/,
    );
    expect(section()).toMatch(/another request gets the saved response, not a 400/);
  });

  it('without the bridge, a retry of a request the old table saved runs again', async () => {
    let runs = 0;
    const app = express();
    app.use(idempotency({ store: postgresStore({ client: pool, table: idemTable }), scope: () => 'acct_1' }));
    app.post('/charges', (_req, res) => {
      runs++;
      res.status(201).json({});
    });
    const url = `${await serve(app)}/charges`;
    const answer = await fetch(url, { method: 'POST', headers: { 'idempotency-key': 'done' } });
    expect(answer.status).toBe(201);
    expect(answer.headers.get('idempotent-replayed')).toBeNull();
    expect(runs).toBe(1);
  });
});
