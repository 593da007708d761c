// Every documented default value (and bound) matches what the code does. options-tables.test.ts
// checks that the documented option NAMES exist; this file checks their DEFAULTS.
//
// Each default is read from the documentation (the Default column of an options table, found as
// options-tables.test.ts finds it, or the sentence that states it, quoted with its file:line), and
// compared with what the code does when the option is left out: observed through behaviour (a 413 at
// exactly N+1 bytes, the Retry-After of a 409, the waits a client sleeps, when a JWKS is fetched
// again on an injected clock) or a public value (`engine.settings`, `sender.schedule`, an exported
// constant). Written by an audit that found every default as documented; a drift on either side fails.
import { Buffer } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import { createClient, RequestFailedError } from '@idem/client';
import {
  createHttpIdempotency,
  createIdempotency,
  defaultMaxResponseBytes,
  type IdempotencyEvent,
  isIdempotencyError,
  makeIdempotent,
  memoryStore,
  recordId,
  type Store,
  toMilliseconds,
} from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  defaultInternalTokenHeader,
  defaultTokenLimits,
  type GuardOptions,
} from '@idem/guard';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { createOutbox, createReceiver, createSender, createVerifier, defaultBodyLimit, sign } from '@idem/webhooks';
import express from 'express';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import {
  AUDIENCE,
  ISSUER,
  makeToken,
  manualClock,
  START_MS,
  testKeys,
} from '../../packages/guard/test/support/tokens.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const MIB = 1_048_576;

// ---------------------------------------------------------------------------------------------
// Reading the documentation

interface DocRow {
  /** `file:line`, for messages. */
  where: string;
  /** The option names in the first column. */
  names: string[];
  /** The cells of the row, trimmed. */
  cells: string[];
}

/** The rows of the first table after the markers (as options-tables.test.ts finds a table). */
function tableAfter(doc: string, markers: readonly string[]): DocRow[] {
  const lines = readFileSync(join(root, doc), 'utf8').split('\n');
  let at = 0;
  for (const marker of markers) {
    const index = lines.findIndex((line, i) => i >= at && line.trim() === marker);
    if (index === -1) throw new Error(`${doc}: no line "${marker}" after line ${at}`);
    at = index + 1;
  }
  const start = lines.findIndex((line, i) => i >= at && line.startsWith('|'));
  if (start === -1) throw new Error(`${doc}: no table after "${markers.at(-1)}"`);
  const rows: DocRow[] = [];
  for (let i = start + 2; i < lines.length && lines[i]?.startsWith('|'); i++) {
    const line = lines[i] as string;
    const cells = line
      .replace(/\\\|/g, '\u{e000}')
      .split('|')
      .slice(1, -1)
      .map((cell) => cell.replaceAll('\u{e000}', '|').trim());
    const names = [...(cells[0] ?? '').matchAll(/`([A-Za-z_$][\w$]*)`/g)].map((m) => m[1] as string);
    rows.push({ where: `${doc}:${i + 1}`, names, cells });
  }
  return rows;
}

/**
 * The documented default of `option` in a table: the Default cell (column `column`), and, for a row
 * that names several options (`storeTimeout`, `conflictRetryAfter`, ... | `'2s'`, `1`, ...), the
 * item at the option's position.
 */
function documentedDefault(
  doc: string,
  markers: readonly string[],
  option: string,
  column = 1,
): { text: string; where: string } {
  const row = tableAfter(doc, markers).find((r) => r.names.includes(option));
  if (row === undefined) throw new Error(`${doc}: no row for ${option} after "${markers.at(-1)}"`);
  const cell = row.cells[column] ?? '';
  if (row.names.length === 1) return { text: cell, where: row.where };
  const items = cell.split(/,\s*(?![^[]*\])|\s+\/\s+/);
  if (items.length !== row.names.length) throw new Error(`${row.where}: ${row.names.length} names, cell "${cell}"`);
  return { text: (items[row.names.indexOf(option)] as string).trim(), where: row.where };
}

/** The line of `doc` (1-based) that contains `text`, for sentences rather than tables. */
function lineOf(doc: string, text: string): { text: string; where: string } {
  const lines = readFileSync(join(root, doc), 'utf8').split('\n');
  const index = lines.findIndex((line) => line.includes(text));
  if (index === -1) throw new Error(`${doc}: no line contains "${text}"`);
  return { text, where: `${doc}:${index + 1}` };
}

/** A documented value as a number: `'24h'` in ms, `1 MiB` in bytes, `10,000`, `5` (seconds stay as they are). */
function amount(text: string): number {
  const bare = text
    .replace(/`/g, '')
    .replace(/\(.*\)/, '')
    .trim()
    .replace(/^'(.*)'$/, '$1');
  const mib = /^(\d+(?:\.\d+)?)\s*MiB$/.exec(bare);
  if (mib) return Number(mib[1]) * MIB;
  if (/^\d[\d,_]*$/.test(bare)) return Number(bare.replace(/[,_]/g, ''));
  return toMilliseconds(bare as never, text);
}

// ---------------------------------------------------------------------------------------------
// Core engine: createIdempotency(...).settings and its answers

const adapterTables: readonly { doc: string; markers: readonly string[] }[] = [
  { doc: 'docs/guides/express.md', markers: ['## Options'] },
  { doc: 'docs/guides/fastify.md', markers: ['## Options'] },
  { doc: 'docs/guides/koa.md', markers: ['## Options'] },
  { doc: 'packages/express/README.md', markers: ['## Options of `idempotency()`'] },
  { doc: 'packages/fastify/README.md', markers: ['## Options of the `idempotency` plugin'] },
  { doc: 'packages/koa/README.md', markers: ['## Options of `idempotency()`'] },
];
const engineTables = [
  ...adapterTables,
  { doc: 'packages/core/README.md', markers: ['## Options of `createIdempotency`'] },
];

describe('engine defaults (createIdempotency)', () => {
  const settings = createIdempotency({ store: memoryStore() }).settings;
  const observed = {
    retention: settings.retentionMs,
    lease: settings.leaseMs,
    storeTimeout: settings.storeTimeoutMs,
    unavailableRetryAfter: settings.unavailableRetryAfter,
  };

  for (const { doc, markers } of engineTables) {
    it(`${doc}: retention, lease, storeTimeout and unavailableRetryAfter are the engine's settings`, () => {
      for (const [option, value] of Object.entries(observed)) {
        const documented = documentedDefault(doc, markers, option);
        expect(value, `${option} at ${documented.where}`).toBe(amount(documented.text));
      }
    });

    it(`${doc}: wait and maxExecution are off (0 in the settings)`, () => {
      expect(documentedDefault(doc, markers, 'wait').text).toBe('off');
      expect(documentedDefault(doc, markers, 'maxExecution').text).toBe('off');
      expect(settings.waitMs).toBe(0);
      expect(settings.maxExecutionMs).toBe(0);
    });
  }

  it('conflictRetryAfter: a 409 carries the documented Retry-After', async () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    const request = {
      method: 'POST',
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: undefined,
      keyHeader: '"k-1"',
      body: undefined,
      scope: 'caller',
    };
    expect((await http.begin(request)).kind).toBe('execute');
    const second = await http.begin(request);
    expect(second.kind).toBe('respond');
    const response = (second as Extract<typeof second, { kind: 'respond' }>).response;
    expect(response.status).toBe(409);
    for (const { doc, markers } of engineTables) {
      const documented = documentedDefault(doc, markers, 'conflictRetryAfter');
      expect(response.headers['retry-after'], documented.where).toBe(String(amount(documented.text)));
    }
  });

  it('unavailableRetryAfter: a 503 from a store that throws carries the documented Retry-After', async () => {
    const broken = {
      ...memoryStore(),
      claim() {
        throw new Error('down');
      },
    } as Store;
    const http = createHttpIdempotency({ store: broken });
    const started = await http.begin({
      method: 'POST',
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: undefined,
      keyHeader: '"k-1"',
      body: undefined,
      scope: 'caller',
    });
    const response = (started as Extract<typeof started, { kind: 'respond' }>).response;
    expect(response.status).toBe(503);
    for (const { doc, markers } of engineTables) {
      const documented = documentedDefault(doc, markers, 'unavailableRetryAfter');
      expect(response.headers['retry-after'], documented.where).toBe(String(amount(documented.text)));
    }
    // docs/concepts.md: "the request gets `503 store_unavailable` with `Retry-After: 2`".
    lineOf('docs/concepts.md', '`503 store_unavailable` with `Retry-After: 2`');
    expect(response.headers['retry-after']).toBe('2');
  });

  it('mismatchStatus: the same key with another request gets the documented status', async () => {
    const engine = createIdempotency({ store: memoryStore() });
    const input = { key: 'k', scope: 's', operation: 'POST /x' };
    const first = await engine.begin({ ...input, fingerprint: 'a' });
    if (first.kind !== 'execute') throw new Error('expected an execution');
    await engine.complete(first.lease, { status: 201, headers: {}, body: Buffer.alloc(0) });
    const other = await engine.begin({ ...input, fingerprint: 'b' });
    expect(other.kind).toBe('reject');
    const status = other.kind === 'reject' ? other.error.status : 0;
    for (const { doc, markers } of engineTables) {
      const documented = documentedDefault(doc, markers, 'mismatchStatus');
      expect(status, documented.where).toBe(amount(documented.text));
    }
  });

  it('heartbeat is on: a handler that outlives one lease keeps its key (renewed)', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval'] });
    onTestFinished(() => {
      vi.useRealTimers();
    });
    let t = 0;
    const clock = () => t;
    const store = memoryStore({ now: clock });
    const engine = createIdempotency({ store, now: clock, lease: '300ms' });
    const begun = await engine.begin({ key: 'k', scope: 's', operation: 'POST /x', fingerprint: 'f' });
    expect(begun.kind).toBe('execute');
    // 800 ms pass on fake timers (the heartbeat's timer among them) and the store's clock in step:
    // on real time, a loaded box ran the heartbeat late enough for the lease to end.
    for (let step = 0; step < 16; step++) {
      t += 50;
      await vi.advanceTimersByTimeAsync(50);
    }
    const again = await createIdempotency({ store, now: clock, lease: '300ms' }).begin({
      key: 'k',
      scope: 's',
      operation: 'POST /x',
      fingerprint: 'f',
    });
    expect(again.kind === 'reject' && again.error.code).toBe('in_progress');
    for (const { doc, markers } of engineTables)
      expect(documentedDefault(doc, markers, 'heartbeat').text).toBe("`true` (`'per-lease'` on Cloudflare Workers)");
    if (begun.kind === 'execute') await engine.release(begun.lease);
  });

  it('replayCache.entries: 10,000 completed outcomes are answered from the process, the 10,001st evicts', async () => {
    // packages/core/README.md (replayCache row): "up to `entries` (10,000)"; docs/stores.md: "(default 10,000)".
    const readme = tableAfter('packages/core/README.md', ['## Options of `createIdempotency`']).find((r) =>
      r.names.includes('replayCache'),
    );
    const documented = Number(/up to `entries` \(([\d,]+)\)/.exec(readme?.cells[2] ?? '')?.[1]?.replace(/,/g, ''));
    expect(
      lineOf('docs/stores.md', `up to \`entries\` of them (default ${documented.toLocaleString('en-US')})`).where,
    ).toBe('docs/stores.md:188');
    // A store other processes would share (no `inProcess`), counting its calls.
    const firstKeyReadAfter = async (completions: number) => {
      const inner = memoryStore();
      let calls = 0;
      const shared: Store = {
        claim: (input) => {
          calls++;
          return inner.claim(input);
        },
        renew: (input) => inner.renew(input),
        complete: (input) => inner.complete(input),
        release: (input) => inner.release(input),
        get: (id) => {
          calls++;
          return inner.get(id);
        },
      };
      const engine = createIdempotency({ store: shared, replayCache: { ttl: '1h' } });
      for (let i = 0; i < completions; i++) {
        const begun = await engine.begin({ key: `k${i}`, scope: 's', operation: 'POST /x', fingerprint: 'f' });
        if (begun.kind !== 'execute') throw new Error('expected an execution');
        await engine.complete(begun.lease, { status: 201, headers: {}, body: Buffer.alloc(0) });
      }
      calls = 0;
      const replay = await engine.begin({ key: 'k0', scope: 's', operation: 'POST /x', fingerprint: 'f' });
      expect(replay.kind).toBe('replay');
      return calls;
    };
    expect(await firstKeyReadAfter(documented), 'the oldest of `entries` outcomes is still cached').toBe(0);
    expect(await firstKeyReadAfter(documented + 1), 'one more evicts the oldest').toBeGreaterThan(0);
  });
});

// ---------------------------------------------------------------------------------------------
// HTTP layer (createHttpIdempotency, behind every adapter)

const keyed = (keyHeader: string | undefined, body?: Buffer, method = 'POST') => ({
  method,
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: body === undefined ? undefined : 'application/octet-stream',
  keyHeader,
  body,
  scope: 'caller',
});

describe('HTTP layer defaults (the adapters)', () => {
  for (const { doc, markers } of adapterTables) {
    describe(doc, () => {
      const documented = (option: string) => documentedDefault(doc, markers, option);

      it('required: a covered request without a key gets 400 key_missing', async () => {
        expect(documented('required').text).toBe('`true`');
        const http = createHttpIdempotency({ store: memoryStore() });
        expect(http.required).toBe(true);
        const started = await http.begin(keyed(undefined));
        expect(started.kind === 'respond' && started.response.status).toBe(400);
      });

      it('methods: POST and PATCH are covered, PUT and DELETE are not', () => {
        expect(documented('methods').text).toBe("`['POST', 'PATCH']`");
        const http = createHttpIdempotency({ store: memoryStore() });
        const covered = ['POST', 'PATCH', 'PUT', 'DELETE'].filter((method) => http.covers(method));
        expect(covered).toEqual(['POST', 'PATCH']);
      });

      it('mintKeys, transactional, strictKeys, advertiseExpiry: off', async () => {
        for (const option of ['mintKeys', 'transactional', 'strictKeys', 'advertiseExpiry']) {
          expect(documented(option).text, option).toBe('`false`');
        }
        const http = createHttpIdempotency({ store: memoryStore() });
        expect(http.mintKeys).toBe(false);
        expect(http.transactional).toBe(false);
        // strictKeys off: a bare key is accepted.
        expect(http.refusesKey('bare-key')).toBe(false);
        const started = await http.begin(keyed('bare-key'));
        expect(started.kind).toBe('execute');
        if (started.kind === 'execute') {
          // advertiseExpiry off: the context announces no expiry (checked on the wire below).
          await http.engine.release(started.lease);
        }
      });

      it("storeUnavailable: 'fail-closed', a store down at claim time gets 503 and the request does not run", async () => {
        expect(documented('storeUnavailable').text).toBe("`'fail-closed'`");
        const store = memoryStore();
        const down: Store = { ...store, claim: () => Promise.reject(new Error('connect ECONNREFUSED (injected)')) };
        const started = await createHttpIdempotency({ store: down }).begin(keyed('k-down'));
        expect(started.kind === 'respond' && started.response.status).toBe(503);
      });

      it('maxBodyBytes: a body of exactly the documented size is taken, one byte more gets 413', async () => {
        const limit = amount(documented('maxBodyBytes').text);
        const http = createHttpIdempotency({ store: memoryStore() });
        expect(http.maxBodyBytes).toBe(limit);
        const atLimit = await http.begin(keyed('"at"', Buffer.alloc(limit, 1)));
        expect(atLimit.kind).toBe('execute');
        const over = await http.begin(keyed('"over"', Buffer.alloc(limit + 1, 1)));
        expect(over.kind === 'respond' && over.response.status).toBe(413);
      });
    });
  }

  // docs/operations.md's sizing example: 50 writes a second kept 24 h, at the table's bytes per
  // completed record with a 1 KiB body (1.4 KiB in Redis, 1.7 KiB in PostgreSQL), in decimal GB.
  it('the sizing example multiplies out: 4.3 million a day, about 6 GB in Redis, 7.5 GB in PostgreSQL', () => {
    const perDay = 50 * 86_400;
    const gb = (kib: number) => (perDay * kib * 1024) / 1e9;
    const text = readFileSync(join(root, 'docs/operations.md'), 'utf8').replace(/\s+/g, ' ');
    expect(text).toContain('| completed, 1 KiB body | about 1.4 KiB | about 1.7 KiB |');
    expect(text).toContain(`is ${(perDay / 1e6).toFixed(1)} million a day`);
    expect(text).toContain(`about ${gb(1.4).toFixed(0)} GB in Redis or ${gb(1.7).toFixed(1)} GB in PostgreSQL`);
  });

  // maxResponseBytes is observed on the wire, through Express: a response body of exactly the limit
  // is stored (a retry replays it), one byte more is served but not stored (`response-not-stored`).
  it('maxResponseBytes: the adapters store a body of exactly the documented size and not one byte more', async () => {
    const limits = adapterTables.map(({ doc, markers }) => documentedDefault(doc, markers, 'maxResponseBytes'));
    const limit = amount(limits[0]?.text ?? '');
    for (const documented of limits) expect(amount(documented.text), documented.where).toBe(limit);
    // docs/operations.md: "`maxResponseBytes`** (adapters, 1 MiB by default; ..."
    expect(lineOf('docs/operations.md', '(adapters, 1 MiB by default;').where).toBe('docs/operations.md:46');
    const events: IdempotencyEvent[] = [];
    const app = express();
    app.use((req, _res, next) => {
      (req as { auth?: unknown }).auth = { sub: 'u', iss: 'https://issuer.test' };
      next();
    });
    app.use(expressIdempotency({ store: memoryStore(), onEvent: (event) => events.push(event) }));
    app.post('/size/:n', (req, res) => {
      res.type('application/octet-stream').send(Buffer.alloc(Number(req.params.n), 7));
    });
    const server = createServer(app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const post = (n: number, key: string) =>
        fetch(`${base}/size/${n}`, { method: 'POST', headers: { 'idempotency-key': key } });
      const stored = await post(limit, '"at-limit"');
      expect((await stored.arrayBuffer()).byteLength).toBe(limit);
      const replay = await post(limit, '"at-limit"');
      await replay.arrayBuffer();
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      const tooLarge = await post(limit + 1, '"over-limit"');
      expect((await tooLarge.arrayBuffer()).byteLength).toBe(limit + 1);
      await vi.waitFor(() => expect(events.some((event) => event.type === 'response-not-stored')).toBe(true));
      // advertiseExpiry off: no Idempotency-Expires on a stored outcome.
      expect(stored.headers.get('idempotency-expires')).toBeNull();
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Stores: memoryStore, redisStore, postgresStore (and its purge)

describe('store defaults', () => {
  it('memoryStore maxEntries: 100,000 records fit, the 100,001st evicts one (docs/stores.md:15, docs/operations.md:55)', () => {
    const documented = amount(
      /`maxEntries`, default\s+([\d,]+)/.exec(readFileSync(join(root, 'docs/stores.md'), 'utf8'))?.[1] ?? '',
    );
    expect(
      lineOf('docs/operations.md', `\`maxEntries\` (${documented.toLocaleString('en-US')} by default)`).where,
    ).toBe('docs/operations.md:55');
    const store = memoryStore();
    const body = Buffer.alloc(0);
    const fill = (i: number) => {
      store.claim({ id: `r${i}`, token: 't', fingerprint: 'f', leaseMs: 60_000 });
      store.complete({
        id: `r${i}`,
        token: 't',
        response: { status: 201, headers: {}, body },
        retentionMs: 86_400_000,
      });
    };
    for (let i = 0; i < documented; i++) fill(i);
    expect(store.size).toBe(documented);
    expect(store.evicted).toBe(0);
    fill(documented);
    expect(store.evicted).toBe(1);
    expect(store.size).toBe(documented);
  });

  it('memoryStore maxBytes: the budget is 256 MiB (docs/stores.md:16, docs/operations.md:55)', () => {
    const documented = /`maxBytes`, default (\d+) MiB/.exec(readFileSync(join(root, 'docs/stores.md'), 'utf8'))?.[1];
    expect(lineOf('docs/operations.md', `\`maxBytes\` (${documented} MiB)`).where).toBe('docs/operations.md:55');
    const store = memoryStore();
    store.claim({ id: 'm', token: 't', fingerprint: 'f', leaseMs: 60_000 });
    // One byte over the budget with its id, token and fingerprint: refused before anything is copied
    // (a zeroed Uint8Array touches no memory), naming the budget.
    const body = new Uint8Array(Number(documented) * 1024 * 1024 - 2);
    let limit: unknown;
    try {
      store.complete({ id: 'm', token: 't', response: { status: 201, headers: {}, body }, retentionMs: 60_000 });
    } catch (error) {
      limit = (error as { limit?: unknown }).limit;
    }
    expect(limit).toBe(Number(documented) * 1024 * 1024);
  });

  it('redisStore: prefix and maxResponseBytes are the documented ones (docs/stores.md Redis options)', () => {
    const store = redisStore({ client: { send: async () => null } });
    const markers = ['## Redis', '### Options'];
    const prefix = documentedDefault('docs/stores.md', markers, 'prefix').text.replace(/`|'/g, '');
    expect(store.key('abc')).toBe(`${prefix}abc`);
    expect(store.maxResponseBytes).toBe(amount(documentedDefault('docs/stores.md', markers, 'maxResponseBytes').text));
    // docs/stores.md:120: "(`undefined` gives `defaultMaxResponseBytes`, 4 MiB)"
    expect(defaultMaxResponseBytes).toBe(4 * MIB);
  });

  describe('postgresStore (PGlite)', () => {
    let db: PGlite | undefined;
    afterEach(async () => {
      await db?.close();
      db = undefined;
    });

    it('table, preparedStatements and maxResponseBytes: the documented defaults', async () => {
      db = new PGlite();
      await migrate(db as never);
      const store = postgresStore({ client: db as never });
      for (const [doc, markers] of [
        ['docs/stores.md', ['## PostgreSQL', '### Options']],
        ['packages/postgres/README.md', ['## Options']],
      ] as const) {
        expect(store.table, doc).toBe(documentedDefault(doc, markers, 'table').text.replace(/`|'/g, ''));
        expect(store.maxResponseBytes, doc).toBe(amount(documentedDefault(doc, markers, 'maxResponseBytes').text));
      }
    });

    it('purgeExpired: deletes at most 1000 rows by default, and keeps a row in progress one hour past its expiry', async () => {
      // docs/stores.md:1006-1007: "deletes at most `batchSize` expired rows (default 1000)".
      // docs/stores.md:1022 and docs/operations.md:72: "`inProgressGraceMs` (default one hour)".
      const text = readFileSync(join(root, 'docs/stores.md'), 'utf8');
      const batch = amount(/expired rows \(default ([\d,]+)\)/.exec(text)?.[1] ?? '');
      expect(text).toContain('only `inProgressGraceMs` (default one hour) after it expired');
      lineOf('docs/operations.md', '`inProgressGraceMs` (one hour by default)');
      db = new PGlite();
      await migrate(db as never);
      const store = postgresStore({ client: db as never });
      // batch + 5 completed rows that expired a minute ago.
      await db.query(
        `INSERT INTO idem_records (id, state, token, fingerprint, status, headers, body, expires_at)
         SELECT 'c' || g, 'completed', 't', 'f', 201, '{}'::jsonb, ''::bytea, clock_timestamp() - interval '1 minute'
           FROM generate_series(1, $1::int) g`,
        [batch + 5],
      );
      expect(await store.purgeExpired()).toBe(batch);
      expect(await store.purgeExpired()).toBe(5);
      // Rows in progress that expired 59 and 61 minutes ago: only the second is past the grace.
      await db.query(
        `INSERT INTO idem_records (id, state, token, fingerprint, expires_at) VALUES
           ('p59', 'in_progress', 't', 'f', clock_timestamp() - interval '59 minutes'),
           ('p61', 'in_progress', 't', 'f', clock_timestamp() - interval '61 minutes')`,
      );
      expect(await store.purgeExpired()).toBe(1);
      const left = await db.query<{ id: string }>('SELECT id FROM idem_records');
      expect(left.rows.map((row) => row.id)).toEqual(['p59']);
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Guard: createGuard, remote JWKS, internal tokens

const guardTable = (option: string) => documentedDefault('docs/guard.md', ['### `createGuard(options)`'], option);
const guardReadme = (option: string) =>
  documentedDefault('packages/guard/README.md', ['## Options of `createGuard()`'], option);
const SECRET = 'test-secret-that-is-long-enough-for-hs256!';

const hsGuard = (options: Partial<GuardOptions> = {}) => {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: false,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
    ...options,
  });
  return { guard, clock };
};

const codeOf = (result: { ok: boolean; error?: { code: string } }) => (result.ok ? 'ok' : result.error?.code);

describe('guard defaults', () => {
  it('clockTolerance: an exp up to 5 s past is accepted, and at most 60 is allowed', async () => {
    const documented = amount(guardTable('clockTolerance').text);
    expect(amount(guardReadme('clockTolerance').text)).toBe(documented);
    const { guard, clock } = hsGuard();
    // The smallest k for which `exp = now - k` is refused: `now < exp + tolerance` makes it the tolerance.
    let refusedFrom = -1;
    for (let k = 0; k <= 61; k++) {
      const token = makeToken({ claims: { exp: clock.seconds() - k, iat: clock.seconds() - 100 } });
      if (codeOf(await guard.verify(token)) === 'token_expired') {
        refusedFrom = k;
        break;
      }
    }
    expect(refusedFrom).toBe(documented);
    // "at most 60" (docs/guard.md createGuard table, packages/guard/README.md "(seconds, at most 60)").
    expect(guardTable('clockTolerance').where).toBe('docs/guard.md:105');
    expect(() => hsGuard({ clockTolerance: 60 })).not.toThrow();
    expect(() => hsGuard({ clockTolerance: 61 })).toThrow(TypeError);
  });

  it('typ: only at+jwt is accepted (a JWT or a token without typ is refused)', async () => {
    expect(guardTable('typ').text).toBe("`['at+jwt']`");
    expect(guardReadme('typ').text).toBe("`['at+jwt']`");
    const { guard } = hsGuard();
    expect(codeOf(await guard.verify(makeToken()))).toBe('ok');
    expect(codeOf(await guard.verify(makeToken({ header: { typ: 'application/at+jwt' } })))).toBe('ok');
    expect(codeOf(await guard.verify(makeToken({ header: { typ: 'JWT' } })))).toBe('type_invalid');
    expect(codeOf(await guard.verify(makeToken({ header: { typ: undefined } })))).toBe('type_invalid');
  });

  it('requiredClaims, rolesClaim, realm, allowQueryToken: the documented defaults', async () => {
    expect(guardTable('requiredClaims').text).toBe('`[]`');
    expect(guardTable('rolesClaim').text).toBe("`'roles'`");
    expect(guardTable('realm').text).toBe("`'api'`");
    expect(guardTable('allowQueryToken').text).toBe('`false`');
    const { guard } = hsGuard();
    // No client_id, jti or iat: nothing beyond iss, sub, aud, exp is required.
    const bare = await guard.verify(makeToken({ omit: ['client_id', 'jti', 'iat'], claims: { roles: ['admin'] } }));
    expect(codeOf(bare)).toBe('ok');
    expect(bare.ok && [...bare.principal.roles]).toEqual(['admin']);
    expect(guard.realm).toBe('api');
    const query = await guard.authenticate({ headers: {}, url: `/orders?access_token=${makeToken()}` });
    expect(codeOf(query)).toBe('token_missing');
  });

  it('limits: 8192 characters of token, 2048 of header segment, nesting 16', async () => {
    const cell = guardTable('limits').text;
    const [maxTokenLength, maxHeaderLength, maxDepth] = [...cell.matchAll(/(\d+)/g)].map((m) => Number(m[1]));
    expect(guardReadme('limits').text).toBe(`${maxTokenLength} / ${maxHeaderLength} / ${maxDepth}`);
    expect(defaultTokenLimits).toEqual({ maxTokenLength, maxHeaderLength, maxDepth });
    const { guard } = hsGuard();
    const bearer = (token: string) => guard.authenticate({ headers: { authorization: `Bearer ${token}` } });
    // Token length: a token of exactly the limit is read (and found malformed), one more is too large.
    const filler = (n: number) => `a.${'b'.repeat(n - 4)}.c`;
    expect(codeOf(await bearer(filler(maxTokenLength as number)))).not.toBe('token_too_large');
    expect(codeOf(await bearer(filler((maxTokenLength as number) + 1)))).toBe('token_too_large');
    // Header segment: base64url of 1536 bytes is 2048 characters, of 1537 bytes 2050.
    const headerOf = (bytes: number) => {
      const base = JSON.stringify({ alg: 'HS256', typ: 'at+jwt', x: '' });
      return { alg: 'HS256', typ: 'at+jwt', x: 'p'.repeat(bytes - base.length) };
    };
    const withHeader = (bytes: number) => makeToken({ header: headerOf(bytes) });
    expect(withHeader(1536).split('.')[0]).toHaveLength(maxHeaderLength as number);
    expect(codeOf(await guard.verify(withHeader(1536)))).toBe('ok');
    expect(codeOf(await guard.verify(withHeader(1537)))).toBe('token_too_large');
    // Depth: the deepest claim nesting accepted (the payload object itself is depth 1).
    // `levels` objects, one inside the other, around a number.
    const nested = (levels: number): unknown => (levels === 0 ? 1 : { a: nested(levels - 1) });
    let deepest = 0;
    for (let depth = 2; depth <= 40; depth++) {
      // The payload object is one level, the claim in it the others.
      if (codeOf(await guard.verify(makeToken({ claims: { deep: nested(depth - 1) } }))) !== 'ok') break;
      deepest = depth;
    }
    expect(deepest).toBe(maxDepth);
  });

  describe('remote JWKS (jwksOptions)', () => {
    const jwksTable = (option: string) =>
      documentedDefault('docs/guard.md', ['### Remote JWKS (`jwksOptions`)'], option);
    const ec = testKeys().ec;
    const jwk = (kid: string) => ({ ...ec.publicJwk, kid, alg: 'ES256', use: 'sig' });

    /** A guard on a remote JWKS served by an injected fetch that counts its calls. */
    const remote = (reply: () => Response, jwksOptions: Record<string, unknown> = {}) => {
      const clock = manualClock();
      let fetches = 0;
      const guard = createGuard({
        audience: AUDIENCE,
        now: clock.now,
        cache: false,
        fetch: async () => {
          fetches++;
          return reply();
        },
        issuers: [{ issuer: ISSUER, jwksUri: 'https://id.example/jwks', algorithms: ['ES256'], jwksOptions }],
      });
      const token = (kid = 'k1') =>
        makeToken({
          alg: 'ES256',
          key: ec.privateKey,
          header: { kid },
          now: clock.now(),
          claims: { exp: START_MS / 1000 + 400_000 },
        });
      return {
        guard,
        clock,
        token,
        get fetches() {
          return fetches;
        },
      };
    };
    const keySet =
      (headers: Record<string, string> = {}, kids = ['k1']) =>
      () =>
        new Response(JSON.stringify({ keys: kids.map(jwk) }), {
          headers: { 'content-type': 'application/json', ...headers },
        });

    // A set lives `ttl` seconds; a verify in its last tenth refreshes in the background, one after
    // it fetches before answering. So: no fetch at just under 0.9 ttl, a fetch just after ttl.
    const lifetimeIs = async (r: ReturnType<typeof remote>, ttl: number) => {
      expect(codeOf(await r.guard.verify(r.token()))).toBe('ok');
      expect(r.fetches).toBe(1);
      r.clock.advance(Math.floor(ttl * 0.9) - 1);
      await r.guard.verify(r.token());
      expect(r.fetches, `no fetch ${Math.floor(ttl * 0.9) - 1} s in`).toBe(1);
      r.clock.advance(ttl - Math.floor(ttl * 0.9) + 2);
      await r.guard.verify(r.token());
      expect(r.fetches, `a fetch ${ttl + 1} s in`).toBe(2);
    };

    it('defaultTtl: a set without cache headers lives 600 s', async () => {
      await lifetimeIs(remote(keySet()), amount(jwksTable('defaultTtl').text));
    });

    it('minTtl: a no-store set lives 30 s', async () => {
      await lifetimeIs(remote(keySet({ 'cache-control': 'no-store' })), amount(jwksTable('minTtl').text));
    });

    it('maxTtl: a max-age of ten days is cut to 86400 s', async () => {
      await lifetimeIs(remote(keySet({ 'cache-control': 'max-age=864000' })), amount(jwksTable('maxTtl').text));
    });

    it('cooldown and negativeTtl: an unknown kid fetches again only 30 s after the last fetch', async () => {
      const cooldown = amount(jwksTable('cooldown').text);
      expect(jwksTable('negativeTtl').text).toBe('the cooldown');
      const r = remote(keySet({ 'cache-control': 'max-age=3600' }));
      await r.guard.verify(r.token('k1'));
      expect(r.fetches).toBe(1);
      r.clock.advance(cooldown - 1);
      expect(codeOf(await r.guard.verify(r.token('k2')))).toBe('key_unknown');
      expect(r.fetches).toBe(1);
      r.clock.advance(2);
      await r.guard.verify(r.token('k3'));
      expect(r.fetches).toBe(2);
      // negativeTtl = cooldown: k3, absent from that fetch, is answered from memory until then.
      r.clock.advance(cooldown + 1);
      await r.guard.verify(r.token('k4'));
      expect(r.fetches).toBe(3);
    });

    it('staleIfError: the last good keys work 3600 s past expiry while refreshes fail', async () => {
      const stale = amount(jwksTable('staleIfError').text);
      let failing = false;
      const good = keySet({ 'cache-control': 'max-age=60' });
      const r = remote(() => (failing ? new Response('down', { status: 500 }) : good()));
      expect(codeOf(await r.guard.verify(r.token()))).toBe('ok');
      failing = true;
      r.clock.advance(60 + stale - 1);
      expect(codeOf(await r.guard.verify(r.token()))).toBe('ok');
      r.clock.advance(2);
      expect(codeOf(await r.guard.verify(r.token()))).toBe('keys_unavailable');
    });

    it('maxBytes: a body of exactly 262144 bytes is read, one byte more is refused', async () => {
      const maxBytes = amount(jwksTable('maxBytes').text);
      const padded = (size: number) => () => {
        const json = JSON.stringify({ keys: [jwk('k1')] });
        return new Response(json + ' '.repeat(size - Buffer.byteLength(json)), {
          headers: { 'content-type': 'application/json' },
        });
      };
      const at = remote(padded(maxBytes));
      expect(codeOf(await at.guard.verify(at.token()))).toBe('ok');
      const over = remote(padded(maxBytes + 1));
      expect(codeOf(await over.guard.verify(over.token()))).toBe('keys_unavailable');
    });

    it('timeout: the fetch is given 5 s', async () => {
      const timeout = amount(jwksTable('timeout').text);
      const spy = vi.spyOn(AbortSignal, 'timeout');
      try {
        const r = remote(keySet());
        await r.guard.verify(r.token());
        expect(spy.mock.calls.map((call) => call[0])).toEqual([timeout * 1000]);
      } finally {
        spy.mockRestore();
      }
    });
  });

  describe('internal tokens', () => {
    const issuerTable = (option: string) =>
      documentedDefault('docs/guard.md', ['### `createInternalTokenIssuer(options)`'], option);
    const verifierTable = (option: string) =>
      documentedDefault('docs/guard.md', ['### `createInternalVerifier(options)`'], option);
    const principalOf = async () => {
      const verified = await hsGuard().guard.verify(makeToken());
      if (!verified.ok) throw new Error('expected a verified token');
      return verified.principal;
    };

    it('ttl: a minted token lives 60 s', async () => {
      const clock = manualClock();
      const internal = createInternalTokenIssuer({ issuer: 'https://gateway.test', now: clock.now });
      const token = await internal.mint(await principalOf(), { audience: 'orders' });
      const claims = JSON.parse(Buffer.from(token.split('.')[1] as string, 'base64url').toString());
      expect(claims.exp - claims.iat).toBe(amount(issuerTable('ttl').text));
    });

    it('rotationDelay: a rotated key signs 60 s after rotate(); maxPublishedKeys: 3 keys published', () => {
      const clock = manualClock();
      const internal = createInternalTokenIssuer({ issuer: 'https://gateway.test', now: clock.now });
      const first = internal.currentKid;
      const next = internal.rotate();
      const delay = amount(issuerTable('rotationDelay').text);
      clock.advance(delay - 1);
      expect(internal.currentKid).toBe(first);
      clock.advance(1);
      expect(internal.currentKid).toBe(next);
      // More rotations, each past its delay and past the ttl of the tokens the key before it signed.
      for (let i = 0; i < 5; i++) {
        internal.rotate();
        clock.advance(delay + 3600);
      }
      expect(internal.jwks().keys).toHaveLength(amount(issuerTable('maxPublishedKeys').text));
    });

    it('the verifier reads idem-internal-token, accepts EdDSA and ES256, with 5 s of tolerance', async () => {
      expect(verifierTable('header').text).toBe(`\`'${defaultInternalTokenHeader}'\``);
      expect(verifierTable('algorithms').text).toBe("`['EdDSA', 'ES256']`");
      const clock = manualClock();
      const internal = createInternalTokenIssuer({ issuer: 'https://gateway.test', now: clock.now });
      const verifier = createInternalVerifier({
        issuer: 'https://gateway.test',
        audience: 'orders',
        jwks: internal.jwks() as never,
        now: clock.now,
      });
      expect(verifier.tokenHeader).toBe(defaultInternalTokenHeader);
      const token = await internal.mint(await principalOf(), { audience: 'orders' });
      const tolerance = amount(verifierTable('clockTolerance').text);
      clock.advance(60 + tolerance - 1);
      expect(codeOf(await verifier.authenticate({ headers: { [defaultInternalTokenHeader]: token } }))).toBe('ok');
      clock.advance(1);
      expect(codeOf(await verifier.authenticate({ headers: { [defaultInternalTokenHeader]: token } }))).toBe(
        'token_expired',
      );
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Client: createClient and its retry options

describe('client defaults (createClient)', () => {
  const clientTable = (option: string) => documentedDefault('docs/client.md', ['## Options of `createClient`'], option);
  const retryTable = (option: string) =>
    documentedDefault('docs/client.md', ['## Waits: backoff, Retry-After, limits'], option);

  /** A client whose every attempt gets `reply()`, recording waits and requests; time only moves when told. */
  const recording = (reply: () => Response, random = 0.5, options: Record<string, unknown> = {}) => {
    const waits: number[] = [];
    const requests: RequestInit[] = [];
    let t = START_MS;
    const client = createClient({
      baseUrl: 'https://api.test',
      fetch: async (_url, init) => {
        requests.push(init);
        return reply();
      },
      random: () => random,
      sleep: async (ms: number) => {
        waits.push(ms);
      },
      now: () => t,
      ...options,
    });
    return {
      client,
      waits,
      requests,
      advance(ms: number) {
        t += ms;
      },
    };
  };
  const unavailable = () => new Response('', { status: 503 });
  const failure = async (promise: Promise<unknown>) => {
    const error = await promise.then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(RequestFailedError);
    return error as RequestFailedError;
  };

  it('maxAttempts 5, baseDelay 1s doubling, full jitter: waits of half the ceilings 1, 2, 4, 8 s with random 0.5', async () => {
    const maxAttempts = amount(retryTable('maxAttempts').text);
    const base = amount(retryTable('baseDelay').text);
    const r = recording(unavailable);
    const error = await failure(r.client.post('/charges', { a: 1 }));
    expect(error.code).toBe('attempts_exhausted');
    expect(r.requests).toHaveLength(maxAttempts);
    expect(r.waits).toEqual(Array.from({ length: maxAttempts - 1 }, (_, i) => (base * 2 ** i) / 2));
  });

  it("jitter 'full': with random 0 every wait is 0 (uniform in [0, ceiling])", async () => {
    expect(retryTable('jitter').text).toBe("`'full'`");
    const r = recording(unavailable, 0);
    await failure(r.client.post('/charges', {}));
    expect(r.waits.every((ms) => ms === 0)).toBe(true);
  });

  it('maxDelay 30s: no ceiling grows beyond it', async () => {
    const maxDelay = amount(retryTable('maxDelay').text);
    const r = recording(unavailable, 1 - 2 ** -53);
    await failure(r.client.post('/charges', {}, { retry: { maxAttempts: 12 } }));
    expect(Math.max(...r.waits)).toBe(maxDelay);
  });

  it('maxRetryAfter 60s: a Retry-After of 60 is waited, 61 ends the operation', async () => {
    const limit = amount(retryTable('maxRetryAfter').text) / 1000;
    const answer = (seconds: number) => () =>
      new Response('', { status: 503, headers: { 'retry-after': String(seconds) } });
    const within = recording(answer(limit), 0);
    await failure(within.client.post('/charges', {}, { retry: { maxAttempts: 2, deadline: false } }));
    expect(within.waits).toEqual([limit * 1000]);
    const beyond = recording(answer(limit + 1), 0);
    const error = await failure(beyond.client.post('/charges', {}, { retry: { maxAttempts: 2, deadline: false } }));
    expect(error.code).toBe('retry_after_too_long');
  });

  it('deadline 60s: an attempt 59 s in still starts, none 61 s in; retryHorizon() is 60 s (docs/client.md:182)', async () => {
    const deadline = amount(retryTable('deadline').text);
    const attemptsWhenEachTakes = async (ms: number) => {
      const r = recording(() => {
        r.advance(ms);
        return unavailable();
      }, 0);
      await failure(r.client.post('/charges', {}, { retry: { maxAttempts: 10 } }));
      return r.requests.length;
    };
    expect(await attemptsWhenEachTakes(deadline - 1000)).toBe(2);
    expect(await attemptsWhenEachTakes(deadline + 1000)).toBe(1);
    expect(lineOf('docs/client.md', 'With the defaults the horizon is 60 s, which is the deadline').where).toBe(
      'docs/client.md:182',
    );
    expect(recording(unavailable).client.retryHorizon()).toBe(60_000);
  });

  it('timeout 10s: an attempt is cut off after 10 s', async () => {
    const timeout = amount(retryTable('timeout').text);
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      let signal: AbortSignal | undefined;
      const client = createClient({
        baseUrl: 'https://api.test',
        fetch: (_url, init) =>
          new Promise((_resolve, reject) => {
            signal = init.signal ?? undefined;
            signal?.addEventListener('abort', () => reject(signal?.reason));
          }),
        now: () => START_MS,
      });
      const pending = client.post('/charges', {}, { retry: { maxAttempts: 1 } }).catch((error: unknown) => error);
      await vi.advanceTimersByTimeAsync(timeout - 1);
      expect(signal?.aborted).toBe(false);
      // The timeout aborts one timer turn after it fires (an answer read during a freeze counts).
      await vi.advanceTimersByTimeAsync(2);
      expect(signal?.aborted).toBe(true);
      expect(((await pending) as RequestFailedError).code).toBe('attempts_exhausted');
    } finally {
      vi.useRealTimers();
    }
  });

  it('maxResponseBytes 16 MiB: a body of exactly 16 MiB is read, one byte more is response_too_large', async () => {
    const limit = amount(clientTable('maxResponseBytes').text);
    const sized = (n: number) => () =>
      new Response(Buffer.alloc(n, 1), { status: 200, headers: { 'content-type': 'application/octet-stream' } });
    expect((await recording(sized(limit)).client.post('/charges', {})).status).toBe(200);
    const error = await failure(recording(sized(limit + 1)).client.post('/charges', {}));
    expect(error.code).toBe('response_too_large');
  });

  it("keyFormat 'sf-string': the key the client makes goes out quoted", async () => {
    expect(clientTable('keyFormat').text).toBe("`'sf-string'`");
    const r = recording(() => new Response('{}', { status: 201, headers: { 'content-type': 'application/json' } }));
    await r.client.post('/charges', {});
    const key = new Headers(r.requests[0]?.headers).get('idempotency-key');
    expect(key).toMatch(/^"[^"]+"$/);
  });
});

// ---------------------------------------------------------------------------------------------
// Webhooks: verifier, receiver, sender, outbox relay, raw body

const WEBHOOK_SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;

describe('webhooks defaults', () => {
  const receiverTable = (option: string) =>
    documentedDefault('packages/webhooks/README.md', ['## Options of `createReceiver()`'], option);

  it("tolerance '5m' both ways: the verifier's resolved window, and a receiver's answers at 300 and 301 s", async () => {
    const documented = receiverTable('tolerance').text.replace(/ both ways$/, '');
    expect(lineOf('docs/webhooks.md', 'The default is 5 minutes in both directions').where).toBe(
      'docs/webhooks.md:100',
    );
    const toleranceMs = amount(documented);
    expect(createVerifier({ secret: WEBHOOK_SECRET }).tolerance).toEqual({
      pastMs: toleranceMs,
      futureMs: toleranceMs,
    });
    const now = START_MS;
    const receiver = createReceiver({
      store: memoryStore(),
      secret: WEBHOOK_SECRET,
      apply: async () => {},
      now: () => now,
    });
    const deliver = (id: string, ageSeconds: number) => {
      const body = '{"type":"x"}';
      const headers = sign({ secret: WEBHOOK_SECRET, id, body, timestamp: now / 1000 - ageSeconds });
      return receiver.handle({ headers: { ...headers }, body: Buffer.from(body) });
    };
    const seconds = toleranceMs / 1000;
    expect((await deliver('evt_old_ok', seconds)).outcome).toBe('applied');
    expect((await deliver('evt_too_old', seconds + 1)).outcome).toBe('rejected');
    expect((await deliver('evt_new_ok', -seconds)).outcome).toBe('applied');
    expect((await deliver('evt_too_new', -seconds - 1)).outcome).toBe('rejected');
  });

  it("retention '7d', lease '10s', transactional on, and the documented 409/503 Retry-After values", async () => {
    const claims: number[] = [];
    const retentions: number[] = [];
    const inner = memoryStore({ now: () => START_MS });
    const store: Store = {
      inProcess: true,
      claim: (input) => {
        claims.push(input.leaseMs);
        return inner.claim(input);
      },
      renew: (input) => inner.renew(input),
      complete: (input) => {
        retentions.push(input.retentionMs);
        return inner.complete(input);
      },
      release: (input) => inner.release(input),
      get: (id) => inner.get(id),
    };
    let release: () => void = () => {};
    const receiver = createReceiver({
      store,
      secret: WEBHOOK_SECRET,
      now: () => START_MS,
      apply: () => new Promise<void>((resolve) => (release = resolve)),
    });
    const body = '{"type":"x"}';
    const headers = sign({ secret: WEBHOOK_SECRET, id: 'evt_1', body, timestamp: START_MS / 1000 });
    const first = receiver.handle({ headers: { ...headers }, body: Buffer.from(body) });
    await vi.waitFor(() => expect(claims).toHaveLength(1));
    const duplicate = await receiver.handle({ headers: { ...headers }, body: Buffer.from(body) });
    // docs/webhooks.md:157: "`in-progress` | 409 + `Retry-After: 1`".
    lineOf('docs/webhooks.md', '| `in-progress` | 409 + `Retry-After: 1` |');
    expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([409, '1']);
    release();
    expect((await first).outcome).toBe('applied');
    expect([...new Set(claims)]).toEqual([amount(receiverTable('lease').text)]);
    expect(retentions).toEqual([amount(receiverTable('retention').text)]);
    expect(lineOf('docs/webhooks.md', 'The receiver keeps ids for **7 days** (`retention`) by default').where).toBe(
      'docs/webhooks.md:334',
    );
    // docs/webhooks.md:160: "`unavailable` | 503 + `Retry-After: 2`".
    lineOf('docs/webhooks.md', '| `unavailable` | 503 + `Retry-After: 2` |');
    const down = createReceiver({
      store: { ...store, claim: () => Promise.reject(new Error('down')) } as Store,
      secret: WEBHOOK_SECRET,
      now: () => START_MS,
      apply: async () => {},
      scope: 'down',
    });
    const refused = await down.handle({ headers: { ...headers }, body: Buffer.from(body) });
    expect([refused.status, refused.headers['retry-after']]).toEqual([503, '2']);
    expect(receiverTable('transactional').text).toBe('`true`');
  });

  it("scope 'webhooks': a receiver without one shares ids with one given scope 'webhooks'", async () => {
    const scope = receiverTable('scope').text.replace(/`|'/g, '');
    const store = memoryStore();
    const warnings: unknown[] = [];
    const named = createReceiver({
      store,
      secret: WEBHOOK_SECRET,
      apply: async () => {},
      scope,
      onWarning: (w) => warnings.push(w),
    });
    const unnamed = createReceiver({
      store,
      secret: WEBHOOK_SECRET,
      apply: async () => {},
      onWarning: (w) => warnings.push(w),
    });
    const body = '{}';
    const headers = sign({ secret: WEBHOOK_SECRET, id: 'evt_s', body, timestamp: new Date() });
    expect((await named.handle({ headers: { ...headers }, body: Buffer.from(body) })).outcome).toBe('applied');
    expect((await unnamed.handle({ headers: { ...headers }, body: Buffer.from(body) })).outcome).toBe('duplicate');
  });

  it("senderHorizon '76h': a retention of 75 h warns, 76 h does not", () => {
    const horizon = amount(receiverTable('senderHorizon').text);
    const warningsFor = (retentionMs: number) => {
      const warnings: unknown[] = [];
      createReceiver({
        store: memoryStore(),
        secret: WEBHOOK_SECRET,
        apply: async () => {},
        retention: `${retentionMs}ms`,
        onWarning: (warning) => warnings.push(warning),
      });
      return warnings.length;
    };
    expect(warningsFor(horizon - 3_600_000)).toBe(1);
    expect(warningsFor(horizon)).toBe(0);
  });

  it('raw body limit 1 MiB (docs/webhooks.md:348): the exported defaultBodyLimit', () => {
    const documented = /bodies over `limit` \(default (\d+ MiB)/.exec(
      readFileSync(join(root, 'docs/webhooks.md'), 'utf8'),
    )?.[1];
    expect(defaultBodyLimit).toBe(amount(documented ?? ''));
  });

  describe('sender', () => {
    const docs = readFileSync(join(root, 'docs/webhooks.md'), 'utf8');
    const sentence = (pattern: RegExp) => pattern.exec(docs)?.[1] ?? '';

    it('schedule: base 1 s (first ceiling), cap 1 h, horizon 24 h, maxAttempts unlimited, maxRetryAfter the cap, timeout 15 s', () => {
      const { schedule } = createSender({ secret: WEBHOOK_SECRET });
      // docs/webhooks.md:445-446: "under 1 s, then 2 s, then 4 s ... grows to the cap (default 1 h)".
      expect(schedule.baseMs).toBe(amount(sentence(/With the defaults that is under (\d+ ?s)/).replace(' ', '')));
      expect(schedule.capMs).toBe(amount(sentence(/grows to the cap \(default (\d+ ?h)\)/).replace(' ', '')));
      // docs/webhooks.md:479: "No attempt starts after `horizon` (default 24 h ..."
      expect(schedule.horizonMs).toBe(amount(sentence(/`horizon` \(default (\d+ ?h)/).replace(' ', '')));
      // docs/webhooks.md:321: "`@idem/webhooks` sender | 24 hours by default (`schedule.horizon`)"
      lineOf('docs/webhooks.md', '| `@idem/webhooks` sender | 24 hours by default (`schedule.horizon`) |');
      // docs/webhooks.md:480: "`maxAttempts` (default unlimited)"
      expect(sentence(/`maxAttempts` \(default (\w+)\)/)).toBe('unlimited');
      expect(schedule.maxAttempts).toBe(Number.POSITIVE_INFINITY);
      // docs/webhooks.md:466: "cut to `maxRetryAfter` (default: the cap)"
      expect(sentence(/cut to `maxRetryAfter` \(default: (the cap)\)/)).toBe('the cap');
      expect(schedule.maxRetryAfterMs).toBe(schedule.capMs);
      // docs/webhooks.md:462: "no response within `timeout` (default 15 s)"
      expect(schedule.timeoutMs).toBe(amount(sentence(/within `timeout` \(default (\d+ ?s)\)/).replace(' ', '')));
    });

    it('the waits it sleeps: ceilings 1, 2, 4 s, full jitter (random 0.5 gives half)', async () => {
      const waits: number[] = [];
      let attempts = 0;
      const sender = createSender({
        secret: WEBHOOK_SECRET,
        random: () => 0.5,
        sleep: async (ms: number) => {
          waits.push(ms);
        },
        now: () => START_MS,
        fetch: async () => new Response('', { status: ++attempts <= 3 ? 500 : 200 }),
      });
      const result = await sender.send({ url: 'https://hooks.test/x', id: 'evt_1', body: '{}' });
      expect(result.outcome).toBe('delivered');
      expect(waits).toEqual([500, 1000, 2000]);
    });
  });

  describe('outbox relay', () => {
    const relayTable = (option: string) => documentedDefault('docs/webhooks.md', ['`outbox.relay(options)`:'], option);

    it("batchSize 10 and lease 'the sender's timeout plus 15 s': what the claim asks the database for", async () => {
      const queries: unknown[][] = [];
      const db = {
        query: async (_text: string, values?: unknown[]) => {
          queries.push(values ?? []);
          return { rows: [], rowCount: 0 };
        },
      };
      const sender = createSender({ secret: WEBHOOK_SECRET });
      const relay = createOutbox().relay({ db, sender });
      await relay.runOnce();
      const [batchSize, leaseMs] = queries[0] as [number, number];
      expect(batchSize).toBe(amount(relayTable('batchSize').text));
      expect(relayTable('lease').text).toBe("the sender's `timeout` plus 15 s");
      expect(leaseMs).toBe(sender.schedule.timeoutMs + 15_000);
    });

    it('maxPerUrl half of batchSize (at least 1): the share each claim gives one URL', async () => {
      expect(relayTable('maxPerUrl').text).toBe('half of `batchSize` (at least 1)');
      for (const [batchSize, share] of [
        [10, 5],
        [7, 3],
        [1, 1],
      ]) {
        const queries: unknown[][] = [];
        const db = {
          query: async (_text: string, values?: unknown[]) => {
            queries.push(values ?? []);
            return { rows: [], rowCount: 0 };
          },
        };
        await createOutbox()
          .relay({ db, sender: createSender({ secret: WEBHOOK_SECRET }), batchSize })
          .runOnce();
        // The claim's last value is the share of a URL with nothing in flight.
        expect(queries[0]?.at(-1)).toBe(share);
      }
    });

    it("pollInterval '1s': an idle relay claims again 1 s after an empty round", async () => {
      const pollMs = amount(relayTable('pollInterval').text);
      vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
      try {
        let rounds = 0;
        const db = {
          query: async () => {
            rounds++;
            return { rows: [], rowCount: 0 };
          },
        };
        const relay = createOutbox().relay({ db, sender: createSender({ secret: WEBHOOK_SECRET }) });
        relay.start();
        await vi.advanceTimersByTimeAsync(0);
        expect(rounds).toBe(1);
        await vi.advanceTimersByTimeAsync(pollMs - 1);
        expect(rounds).toBe(1);
        await vi.advanceTimersByTimeAsync(1);
        expect(rounds).toBe(2);
        const stopped = relay.stop();
        await vi.advanceTimersByTimeAsync(0);
        await stopped;
      } finally {
        vi.useRealTimers();
      }
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Documented bounds, and a few defaults stated in prose

describe('documented bounds', () => {
  const receiverTable = (option: string) =>
    documentedDefault('packages/webhooks/README.md', ['## Options of `createReceiver()`'], option);
  it('keys: 255 bytes are accepted, 256 are key_invalid (docs/errors.md:51, docs/guides/express.md:257)', async () => {
    const bound = Number(/over (\d+) bytes/.exec(lineOf('docs/errors.md', 'over 255 bytes').text)?.[1]);
    lineOf('docs/guides/express.md', 'Empty, over 255 bytes');
    const http = createHttpIdempotency({ store: memoryStore() });
    expect(http.refusesKey('k'.repeat(bound))).toBe(false);
    expect(http.refusesKey('k'.repeat(bound + 1))).toBe(true);
  });

  it('retention: 24 h needs no acknowledgement, less does (every adapter table)', () => {
    for (const { doc, markers } of engineTables) {
      expect(
        tableAfter(doc, markers)
          .find((r) => r.names.includes('retention'))
          ?.cells.join('|'),
      ).toMatch(/below 24 h needs `acknowledgeShortRetention: true`/i);
    }
    expect(() => createIdempotency({ store: memoryStore(), retention: '24h' })).not.toThrow();
    expect(() => createIdempotency({ store: memoryStore(), retention: '86399999ms' })).toThrow(TypeError);
  });

  it("replayCache.ttl: at most '1h' (the guides' and the core README's replayCache rows)", () => {
    lineOf('docs/guides/express.md', 'for `ttl` (at most `1h`)');
    expect(() => createIdempotency({ store: memoryStore(), replayCache: { ttl: '1h' } })).not.toThrow();
    expect(() => createIdempotency({ store: memoryStore(), replayCache: { ttl: '3600001ms' } })).toThrow(TypeError);
  });

  it("webhook tolerance: at least '1s' each way (packages/webhooks/README.md tolerance row, docs/webhooks.md:100-101)", () => {
    expect(receiverTable('tolerance')).toBeDefined();
    expect(() => createVerifier({ secret: WEBHOOK_SECRET, tolerance: '1s' })).not.toThrow();
    expect(() => createVerifier({ secret: WEBHOOK_SECRET, tolerance: '999ms' })).toThrow(TypeError);
    expect(() => createVerifier({ secret: WEBHOOK_SECRET, tolerance: { past: '1s', future: '999ms' } })).toThrow(
      TypeError,
    );
  });

  it('internal token ttl 1 to 3600, rotationDelay 0 to 3600 (docs/guard.md createInternalTokenIssuer table)', () => {
    const issuer = (options: Record<string, number>) => () =>
      createInternalTokenIssuer({ issuer: 'https://gateway.test', ...options });
    expect(issuer({ ttl: 1 })).not.toThrow();
    expect(issuer({ ttl: 3600 })).not.toThrow();
    expect(issuer({ ttl: 0 })).toThrow(TypeError);
    expect(issuer({ ttl: 3601 })).toThrow(TypeError);
    expect(issuer({ rotationDelay: 0 })).not.toThrow();
    expect(issuer({ rotationDelay: 3600 })).not.toThrow();
    expect(issuer({ rotationDelay: 3601 })).toThrow(TypeError);
  });

  it('outbox deadLetters: limit defaults to 100 (docs/webhooks.md:792)', async () => {
    const documented = Number(
      /`limit` defaults to (\d+)\./.exec(readFileSync(join(root, 'docs/webhooks.md'), 'utf8'))?.[1],
    );
    expect(lineOf('docs/webhooks.md', `\`limit\` defaults to ${documented}.`).where).toBe('docs/webhooks.md:792');
    const asked: unknown[][] = [];
    const db = {
      query: async (_text: string, values?: unknown[]) => {
        asked.push(values ?? []);
        return { rows: [], rowCount: 0 };
      },
    };
    await createOutbox().deadLetters(db);
    // One row more than the page, to know whether there is a next one.
    expect(asked[0]?.[0]).toBe(documented + 1);
  });
});

describe('makeIdempotent defaults (docs/guides/queues.md)', () => {
  const queuesTable = (option: string) =>
    documentedDefault('docs/guides/queues.md', ['## The wrapper', '### Options'], option);
  const wrap = <R>(store: Store, result: () => R) =>
    makeIdempotent(async () => result(), {
      engine: createIdempotency({ store }),
      operation: 'op',
      key: (id: string) => id,
      payload: (id: string) => id,
    });

  it('maxResultBytes 1 MiB: a result that size, as the stores count it, is kept; one byte more is not', async () => {
    const documented = amount(queuesTable('maxResultBytes').text);
    expect(documented).toBe(MIB);
    // A JSON string result: 15 bytes of framing, the kind header, the quotes, then the characters.
    const overhead = 15 + Buffer.byteLength(JSON.stringify({ 'x-result': 'json' })) + 2;
    const store = memoryStore();
    let runs = 0;
    const fits = wrap(store, () => {
      runs++;
      return 'x'.repeat(documented - overhead);
    });
    await fits('a');
    expect(await fits('a')).toHaveLength(documented - overhead);
    const over = wrap(store, () => {
      runs++;
      return 'x'.repeat(documented - overhead + 1);
    });
    const refused = await over('b').catch((error: unknown) => error);
    expect(isIdempotencyError(refused) && refused.code).toBe('response_not_replayable');
    expect(runs).toBe(2);
  });

  it("scope: one scope, '', for every message when it is left out", async () => {
    expect(queuesTable('scope').text).toMatch(/^`''`/);
    const store = memoryStore();
    await wrap(store, () => 'done')('k-1');
    expect(store.get(recordId('', 'op', 'k-1'))).toMatchObject({ state: 'completed' });
  });
});
