// Audit: a support engineer's day with one key. Runs "Investigating one key" of docs/operations.md
// as it is on the page: the TypeScript block (investigate.ts) is compiled and imported, the
// redis-cli blocks run in bash against the real Redis, the SQL blocks run in psql against the real
// PostgreSQL, each against a real Express server with idem on that store. A ticket's key must lead
// to the record the server used (the id of its events), the record must read as the page says, and
// the page's remedies must free a stuck key and forget a wrongly stored outcome, fenced: never when
// the record changed since it was read.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import {
  createIdempotency,
  type IdempotencyEvent,
  makeIdempotent,
  memoryStore,
  recordId,
  type Store,
  type StoreRecord,
} from '@idem/core';
import { idempotency } from '@idem/express';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import { Redis } from 'ioredis';
import pg from 'pg';
import ts from 'typescript';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');
const block = (title: string): string => {
  const escaped = title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const found = new RegExp(`^\`\`\`\\w+ title="${escaped}"\\n([\\s\\S]*?)^\`\`\`\\s*$`, 'm').exec(page)?.[1];
  if (found === undefined) throw new Error(`docs/operations.md has no block titled ${title}`);
  return found;
};

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const which = (tool: string) =>
  new Promise<boolean>((resolve) => execFile('sh', ['-c', `command -v ${tool}`], (error) => resolve(!error)));
const withRedis = serviceAvailable(
  `Redis at ${redisUrl} (and redis-cli)`,
  (await redisAnswers(redisUrl)) && (await which('redis-cli')),
  'the key investigation on Redis',
);
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl} (and psql)`,
  (await postgresAnswers(databaseUrl)) && (await which('psql')),
  'the key investigation on PostgreSQL',
);

interface Ticket {
  iss: string;
  sub: string;
  operation: string;
  keyHeader: string;
}
interface Recipe {
  ticketRecordId(ticket: Ticket): string;
  inspectRecord(store: Store, id: string): Promise<StoreRecord | undefined>;
}
let recipe: Recipe;
let scratch = '';

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'investigating-audit-'));
  const file = join(scratch, 'investigate.mjs');
  writeFileSync(
    file,
    ts.transpileModule(block('investigate.ts'), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, verbatimModuleSyntax: true },
    }).outputText,
  );
  recipe = (await import(pathToFileURL(file).href)) as Recipe;
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const run = (command: string, args: string[], env: Record<string, string> = {}) =>
  new Promise<string>((resolve, reject) =>
    execFile(command, args, { env: { ...process.env, ...env }, encoding: 'utf8' }, (error, stdout, stderr) =>
      error ? reject(new Error(`${command} failed: ${stderr || error.message}`)) : resolve(stdout),
    ),
  );

// A block of shell commands as the page has it; `redis-cli` reaches the test's Redis, and the key
// is under the test's prefix instead of the default `idem:`.
const redisShell = (title: string, prefix: string, env: Record<string, string>) =>
  run(
    'bash',
    [
      '-c',
      `set -e\nredis-cli() { command redis-cli -u "$TEST_REDIS_URL" "$@"; }\n${block(title).replace('"idem:$ID"', `"${prefix}$ID"`)}`,
    ],
    { TEST_REDIS_URL: redisUrl, ...env },
  );

// A SQL block as the page has it, through psql with its variables; one row of named columns or none.
const psql = async (title: string, vars: Record<string, string>): Promise<Record<string, string> | undefined> => {
  const file = join(scratch, `${title}`);
  writeFileSync(file, block(title));
  const args = [databaseUrl, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-A', '-F', '\x1f', '-P', 'footer=off'];
  for (const [name, value] of Object.entries(vars)) args.push('-v', `${name}=${value}`);
  const out = await run('psql', [...args, '-f', file]);
  const [header, row] = out.split('\n');
  if (header === undefined || row === undefined || row === '') return undefined;
  const names = header.split('\x1f');
  const values = row.split('\x1f');
  return Object.fromEntries(names.map((name, i) => [name, values[i] ?? '']));
};

const iss = 'https://id.example';
const sub = 'user_42';

/** One Express server with idem on `store`, whose /charges handler the test steers call by call. */
async function chargesServer(store: Store) {
  const events: IdempotencyEvent[] = [];
  const answers: Array<() => Promise<{ status: number; body: unknown }>> = [];
  let runs = 0;
  const app = express();
  app.use((req, _res, next) => {
    (req as unknown as { auth: unknown }).auth = { iss, sub };
    next();
  });
  app.post(
    '/charges',
    // A short lease, so the holder's process notices a freed key within a second or two (see below).
    idempotency({ store, lease: '3s', onEvent: (event) => void events.push(event) }),
    express.json(),
    async (_req, res) => {
      runs++;
      const answer = answers.shift() ?? (async () => ({ status: 201, body: { id: `ch_${runs}` } }));
      const { status, body } = await answer();
      res.status(status).json(body);
    },
  );
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as { port: number };
  const post = async (keyHeader: string) => {
    const response = await fetch(`http://127.0.0.1:${port}/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': keyHeader },
      body: JSON.stringify({ amount: 100 }),
    });
    return {
      status: response.status,
      replayed: response.headers.get('idempotent-replayed'),
      body: await response.json(),
    };
  };
  // A retry of a key the operator freed: the holder's own process answers 409 from its memory of
  // the lease until its next renewal is refused (at most about two thirds of a lease), as the page says.
  const retryFreed = async (keyHeader: string) => {
    for (let i = 0; i < 200; i++) {
      const answer = await post(keyHeader);
      if (answer.status !== 409) return answer;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error('the freed key kept answering 409');
  };
  return {
    events,
    answers,
    post,
    retryFreed,
    runs: () => runs,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

// Every gate is opened after its test, so a test that failed midway leaves no handler hanging
// (and no server that cannot close).
const gates: Array<() => void> = [];
afterEach(() => {
  for (const open of gates.splice(0)) open();
});
const gate = () => {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  gates.push(open);
  return { open, opened };
};

const until = async (check: () => boolean | Promise<boolean>, what: string) => {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
};

const ticketFor = (keyHeader: string): Ticket => ({ iss, sub, operation: 'POST /charges', keyHeader });
const freshKey = () => `9f1c-${Math.random().toString(36).slice(2)}`;

describe('investigating one key: the record id and the Store contract (memory store)', () => {
  it('the ticket leads to the id of the events, and get reads the outcome stored', async () => {
    const store = memoryStore();
    const server = await chargesServer(store);
    try {
      const key = freshKey();
      expect((await server.post(`"${key}"`)).status).toBe(201);
      // The customer quotes the header without the sf-string quotes: the same key.
      const id = recipe.ticketRecordId(ticketFor(key));
      expect(server.events.filter((e) => e.type === 'claim').map((e) => e.id)).toEqual([id]);
      const record = await recipe.inspectRecord(store, id);
      expect(record?.state).toBe('completed');
      if (record?.state !== 'completed') return;
      expect(record.response.status).toBe(201);
      expect(JSON.parse(Buffer.from(record.response.body).toString())).toEqual({ id: 'ch_1' });
      expect(record.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    } finally {
      await server.close();
    }
  });

  it('makeIdempotent: the record id is recordId of the empty scope, the operation option and the key', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store: memoryStore(), onEvent: (event) => void events.push(event) });
    const processOrder = makeIdempotent(async (order: { id: string }) => order.id, {
      engine,
      operation: 'processOrder',
      key: (order) => order.id,
      payload: (order) => JSON.stringify(order),
    });
    await processOrder({ id: 'order-9f1c' });
    expect(events.find((e) => e.type === 'claim')?.id).toBe(recordId('', 'processOrder', 'order-9f1c'));
  });

  it('a stuck key is freed with store.release and its token: the retry runs, the old holder is fenced', async () => {
    const store = memoryStore();
    const server = await chargesServer(store);
    try {
      const key = freshKey();
      const hung = gate();
      server.answers.push(async () => {
        await hung.opened;
        return { status: 201, body: { id: 'late' } };
      });
      const first = server.post(key);
      const id = recipe.ticketRecordId(ticketFor(key));
      await until(async () => (await recipe.inspectRecord(store, id))?.state === 'in_progress', 'the claim');
      expect((await server.post(key)).status).toBe(409);
      const record = await recipe.inspectRecord(store, id);
      expect(await store.release({ id, token: record?.token ?? '' })).toBe(true);
      const retry = await server.retryFreed(key);
      expect(retry).toMatchObject({ status: 201, body: { id: 'ch_2' } });
      hung.open();
      expect((await first).status).toBe(201);
      await until(() => server.events.some((e) => e.type === 'lease-lost' && e.id === id), 'the fenced holder');
      expect((await server.post(key)).body).toEqual({ id: 'ch_2' });
    } finally {
      await server.close();
    }
  });

  // Was wrong: the memory store had no way to forget a completed record (release only frees one in
  // progress), so a 500 stored during an outage replayed for the whole retention unless the process
  // restarted. The Store contract's optional `forget` does it, fenced by the token as release is.
  it('a wrongly stored 500 can be forgotten through the Store contract, so the retry runs', async () => {
    const store = memoryStore();
    const server = await chargesServer(store);
    try {
      const key = freshKey();
      server.answers.push(async () => ({ status: 500, body: { error: 'database down' } }));
      expect((await server.post(key)).status).toBe(500);
      const id = recipe.ticketRecordId(ticketFor(key));
      const record = await recipe.inspectRecord(store, id);
      expect(record?.state).toBe('completed');
      expect(await store.forget({ id, token: record?.token ?? '' })).toBe(true);
      expect(await recipe.inspectRecord(store, id)).toBeUndefined();
      expect((await server.post(key)).status).toBe(201);
    } finally {
      await server.close();
    }
  });
});

describe.runIf(withRedis)('investigating one key on Redis, with redis-cli', () => {
  const prefix = `audit-support:inv:${process.pid}:`;
  let redis: Redis;
  let store: Store;
  let server: Awaited<ReturnType<typeof chargesServer>>;

  beforeAll(async () => {
    redis = new Redis(redisUrl, { lazyConnect: true });
    await redis.connect();
    store = redisStore({ client: redis, prefix });
    server = await chargesServer(store);
  });
  afterAll(async () => {
    await server?.close();
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  });

  const inspect = async (id: string) => {
    const out = await redisShell('redis-inspect.sh', prefix, { ID: id });
    const lines = out.split('\n');
    // GET's value (its lines, the body last), then PTTL's answer on the last line.
    const pttl = Number(lines.at(-2));
    return { lines: lines.slice(0, -2), pttl };
  };
  const forget = (id: string, firstLine: string) =>
    redisShell('redis-forget.sh', prefix, { ID: id, K: `${prefix}${id}`, FIRST_LINE: firstLine });

  it('GET and PTTL read a completed record as the page says: token line, fingerprint, status and headers, body; retention left', async () => {
    const key = freshKey();
    expect((await server.post(key)).status).toBe(201);
    const id = recipe.ticketRecordId(ticketFor(`"${key}"`));
    expect(server.events.find((e) => e.type === 'complete' && e.id === id)).toBeDefined();
    const { lines, pttl } = await inspect(id);
    const record = await recipe.inspectRecord(store, id);
    expect(record?.state).toBe('completed');
    expect(lines[0]).toBe(`c${JSON.stringify(record?.token)}`);
    expect(lines[1]).toBe(JSON.stringify(record?.fingerprint));
    expect(JSON.parse(lines[2] ?? '')).toMatchObject({
      s: 201,
      h: { 'content-type': expect.stringContaining('json') },
    });
    expect(JSON.parse(lines.slice(3).join('\n'))).toEqual(
      JSON.parse(Buffer.from(record?.state === 'completed' ? record.response.body : []).toString()),
    );
    // The default retention, 24 h, less the moments since.
    expect(pttl).toBeGreaterThan(23 * 3_600_000);
    expect(pttl).toBeLessThanOrEqual(24 * 3_600_000);
  });

  it('a record in progress: PTTL less the keep of line 3 is the lease left; the fenced delete frees it, the retry runs, the old holder is fenced', async () => {
    const key = freshKey();
    const hung = gate();
    server.answers.push(async () => {
      await hung.opened;
      return { status: 201, body: { id: 'late' } };
    });
    const before = server.runs();
    const first = server.post(key);
    const id = recipe.ticketRecordId(ticketFor(key));
    await until(async () => (await recipe.inspectRecord(store, id))?.state === 'in_progress', 'the claim');
    const { lines, pttl } = await inspect(id);
    expect(lines[0]).toMatch(/^p"/);
    const keep = Number(lines[2]);
    expect(keep).toBe(24 * 3_600_000);
    const leaseLeft = pttl - keep;
    expect(leaseLeft).toBeGreaterThan(0);
    expect(leaseLeft).toBeLessThanOrEqual(3_000);
    expect((await server.post(key)).status).toBe(409);

    expect((await forget(id, lines[0] ?? '')).trim()).toBe('1');
    const retry = await server.retryFreed(key);
    expect(retry.status).toBe(201);
    expect(server.runs()).toBe(before + 2);
    hung.open();
    expect((await first).status).toBe(201);
    await until(() => server.events.some((e) => e.type === 'lease-lost' && e.id === id), 'the fenced holder');
    // Its renewal found the key gone: the signal aborted then, and its late answer was not stored.
    expect(server.events.find((e) => e.type === 'lease-lost' && e.id === id)).toMatchObject({
      reason: 'renew-refused',
    });
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: 'true', body: retry.body });
  });

  it('a wrongly stored 500: the fenced delete with its first line forgets it, and the retry runs', async () => {
    const key = freshKey();
    server.answers.push(async () => ({ status: 500, body: { error: 'database down' } }));
    expect((await server.post(key)).status).toBe(500);
    expect(await server.post(key)).toMatchObject({ status: 500, replayed: 'true' });
    const id = recipe.ticketRecordId(ticketFor(key));
    const { lines } = await inspect(id);
    expect(JSON.parse(lines[2] ?? '')).toMatchObject({ s: 500 });
    expect((await forget(id, lines[0] ?? '')).trim()).toBe('1');
    expect((await inspect(id)).pttl).toBe(-2);
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: null });
  });

  it('the delete refuses a record that changed since it was read: in progress then, completed now', async () => {
    const key = freshKey();
    const hung = gate();
    server.answers.push(async () => {
      await hung.opened;
      return { status: 201, body: { id: 'done' } };
    });
    const first = server.post(key);
    const id = recipe.ticketRecordId(ticketFor(key));
    await until(async () => (await recipe.inspectRecord(store, id))?.state === 'in_progress', 'the claim');
    const read = (await inspect(id)).lines[0] ?? '';
    hung.open();
    expect((await first).status).toBe(201);
    expect((await forget(id, read)).trim()).toBe('0');
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: 'true', body: { id: 'done' } });
  });
});

describe.runIf(withPostgres)('investigating one key on PostgreSQL, with psql', () => {
  let pool: pg.Pool;
  let store: Store;
  let server: Awaited<ReturnType<typeof chargesServer>>;

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    pool.on('error', () => {});
    // The page's SQL names the default table.
    await migrate(pool);
    store = postgresStore({ client: pool });
    server = await chargesServer(store);
  });
  afterAll(async () => {
    await server?.close();
    await pool?.end();
  });

  const inspect = (id: string) => psql('postgres-inspect.sql', { id });
  const forget = (id: string, token: string, state: string) => psql('postgres-forget.sql', { id, token, state });

  it('the SELECT reads a completed record: status, headers, body, retention left', async () => {
    const key = freshKey();
    expect((await server.post(key)).status).toBe(201);
    const id = recipe.ticketRecordId(ticketFor(key));
    const row = await inspect(id);
    const record = await recipe.inspectRecord(store, id);
    expect(row).toMatchObject({
      state: 'completed',
      token: record?.token,
      fingerprint: record?.fingerprint,
      status: '201',
      // The handler set no phrase of its own: NULL, printed empty.
      status_message: '',
      expired: 'f',
      lease_left: '',
    });
    expect(JSON.parse(row?.headers ?? '')).toMatchObject({ 'content-type': expect.stringContaining('json') });
    expect(JSON.parse(row?.body ?? '')).toEqual({ id: expect.stringMatching(/^ch_/) });
    expect(row?.expires_in).toMatch(/^23:59:/);
  });

  it('a record in progress: lease_left is the lease; the fenced delete frees it, the retry runs, the old holder is fenced', async () => {
    const key = freshKey();
    const hung = gate();
    server.answers.push(async () => {
      await hung.opened;
      return { status: 201, body: { id: 'late' } };
    });
    const first = server.post(key);
    const id = recipe.ticketRecordId(ticketFor(key));
    await until(async () => (await recipe.inspectRecord(store, id))?.state === 'in_progress', 'the claim');
    const row = await inspect(id);
    expect(row).toMatchObject({ state: 'in_progress', status: '', expired: 'f' });
    expect(row?.lease_left).toMatch(/^00:00:0[0-3](\.\d+)?$/);
    expect(row?.expires_in).toMatch(/^1 day 00:00:0[0-3](\.\d+)?$/);
    expect((await server.post(key)).status).toBe(409);

    expect(await forget(id, row?.token ?? '', row?.state ?? '')).toEqual({ id });
    const retry = await server.retryFreed(key);
    expect(retry.status).toBe(201);
    hung.open();
    expect((await first).status).toBe(201);
    await until(() => server.events.some((e) => e.type === 'lease-lost' && e.id === id), 'the fenced holder');
    // Its renewal found the key gone: the signal aborted then, and its late answer was not stored.
    expect(server.events.find((e) => e.type === 'lease-lost' && e.id === id)).toMatchObject({
      reason: 'renew-refused',
    });
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: 'true', body: retry.body });
  });

  it('a wrongly stored 500: the fenced DELETE forgets it, and the retry runs', async () => {
    const key = freshKey();
    server.answers.push(async () => ({ status: 500, body: { error: 'database down' } }));
    expect((await server.post(key)).status).toBe(500);
    const id = recipe.ticketRecordId(ticketFor(key));
    const row = await inspect(id);
    expect(row).toMatchObject({ state: 'completed', status: '500' });
    expect(await forget(id, row?.token ?? '', row?.state ?? '')).toEqual({ id });
    expect(await inspect(id)).toBeUndefined();
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: null });
  });

  it('the DELETE refuses a record that changed since it was read: in progress then, completed now', async () => {
    const key = freshKey();
    const hung = gate();
    server.answers.push(async () => {
      await hung.opened;
      return { status: 201, body: { id: 'done' } };
    });
    const first = server.post(key);
    const id = recipe.ticketRecordId(ticketFor(key));
    await until(async () => (await recipe.inspectRecord(store, id))?.state === 'in_progress', 'the claim');
    const row = await inspect(id);
    hung.open();
    expect((await first).status).toBe(201);
    expect(await forget(id, row?.token ?? '', row?.state ?? '')).toBeUndefined();
    expect(await server.post(key)).toMatchObject({ status: 201, replayed: 'true', body: { id: 'done' } });
  });
});
