// Newcomer audit: the guides followed literally, from the packed packages in a project outside the
// repository (README, the three framework guides, stores, guard, client, webhooks), with the real
// Redis and PostgreSQL. Nearly everything did what the pages say; these are the places where a
// reader who copies a snippet, or trusts a figure, gets something else. Each test reads the claim
// from the Markdown and checks it against the code, so it follows the page when the page changes.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import { createIdempotency } from '@idem/core';
import { stripIdentityHeaders } from '@idem/guard';
import { migrate, postgresStore } from '@idem/postgres';
import { redisCommandRunner, redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = (name: string) => readFileSync(join(root, 'docs', name), 'utf8');
// Each claim is read from its page here, outside the expected failures: a page that no longer says
// it fails this file loudly instead of letting an it.fails pass for the wrong reason.
function claim(name: string, pattern: RegExp): string {
  const found = page(name).match(pattern)?.[1];
  if (found === undefined) throw new Error(`docs/${name} no longer matches ${pattern}: revisit this audit`);
  return found;
}
const pglitePath = claim('stores.md', /new PGlite\('([^']+)'\)/);
const statedRoundTrips = Number(claim('stores.md', /A 409 costs (\d+)/));
const stripExtra = JSON.parse(
  claim('guard.md', /stripIdentityHeaders\(incoming, \{ extra: (\[[^\]]*\]) \}\)/).replaceAll("'", '"'),
) as string[];

describe('docs/stores.md, PostgreSQL: "The embedded default, with no server to run"', () => {
  // docs/stores.md:414 gives `new PGlite('./data/idem')` ("on disk"), then `await migrate(db)`.
  // Copied into a fresh project, the first statement fails: PGlite creates its data directory with
  // a plain mkdirSync (not recursive), so `./data` must exist first, and migrate() rejects with
  // `ENOENT: no such file or directory, mkdir './data/idem'` (PGlite 0.3 in this repository, 0.5 from
  // npm alike). The same example is in the TSDoc of PGliteLike (packages/postgres/src/sql-client.ts:102).
  // Was a defect: the page's `new PGlite('./data/idem')` throws ENOENT in a fresh project (its parent folder must exist).
  it("the page's on-disk PGlite path works in an empty project folder", async () => {
    const project = mkdtempSync(join(tmpdir(), 'idem-newcomer-'));
    try {
      const db = new PGlite(join(project, pglitePath));
      try {
        await migrate(db);
        expect(postgresStore({ client: db })).toBeDefined();
      } finally {
        await db.close().catch(() => undefined);
      }
    } finally {
      rmSync(project, { recursive: true, force: true });
    }
  });
});

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the newcomer Redis check');

describe.skipIf(!withRedis)('docs/stores.md, Redis: Sizing', () => {
  const client = new Redis(redisUrl);
  afterAll(async () => {
    await client.quit();
  });

  // docs/stores.md:356 (Sizing): "A replay or a 409 also costs 2: the refused `SET NX`, then the
  // `GET`." The operation table of the same page (line 201) says a claim costs "2 when the key is
  // taken (3 when it is in progress)", and the code does the latter: a record in progress is read
  // again with its PTTL by the inspect script (packages/redis/src/redis-store.ts), so a 409 is
  // SET NX, GET, EVALSHA. Someone sizing Redis for a retry storm on slow handlers counts one round
  // trip in three short.
  // Was a defect: the Sizing paragraph says a 409 costs 2 round trips; it costs 3 (SET NX, GET, the PTTL script).
  it('a 409 costs the round trips the Sizing paragraph says', async () => {
    const inner = redisCommandRunner(client);
    let roundTrips = 0;
    const counted = {
      send: (key: string, args: ReadonlyArray<string | Buffer>) => {
        roundTrips++;
        return inner.send(key, args);
      },
    };
    const prefix = `idem-test:newcomer:${crypto.randomUUID()}:`;
    // Two processes' engines on one Redis: the first holds the key, the second gets the 409.
    const holder = createIdempotency({ store: redisStore({ client: counted, prefix }), heartbeat: false });
    const other = createIdempotency({ store: redisStore({ client: counted, prefix }), heartbeat: false });
    const request = { key: 'k-1', scope: 'demo', operation: 'POST /charges', fingerprint: 'fp' };
    const first = await holder.begin(request);
    expect(first.kind).toBe('execute');
    roundTrips = 0;
    const second = await other.begin(request);
    expect(second).toMatchObject({ kind: 'reject', error: { code: 'in_progress' } });
    try {
      expect(roundTrips).toBe(statedRoundTrips);
    } finally {
      if (first.kind === 'execute') await holder.release(first.lease);
    }
  });
});

describe('docs/guard.md, At the gateway: the stripIdentityHeaders() example', () => {
  // docs/guard.md:619 shows `stripIdentityHeaders(incoming, { namespaces: ['x-user-*', 'x-auth-*'] })`
  // with no word on what `namespaces` does, beside `extra: ['x-tenant-*'] // more families to strip`
  // on forwardHeaders. `namespaces` REPLACES the default families (packages/guard/src/strip-headers.ts:129),
  // so the copied call lets through what the same page says is stripped: `X-Forwarded-For`
  // ("stripped by default"; "set `keepForwarded: true` ... on `stripIdentityHeaders`" to keep it),
  // a forged `idem-internal-token`, and `X-UserId` (the hyphenless spelling the page lists as gone).
  // The TSDoc of defaultIdentityHeaders shows the safe form: `[...defaultIdentityHeaders, 'x-tenant-*']`.
  // Was a defect: the example's `namespaces` replaces the defaults, so X-Forwarded-For, idem-internal-token and X-UserId pass.
  it("the page's call strips the headers the page says are stripped", () => {
    const stripped = stripIdentityHeaders(
      {
        'x-user-id': 'admin',
        'x-forwarded-for': '10.0.0.1',
        'idem-internal-token': 'forged',
        'x-userid': 'admin',
        'x-tenant-id': 't_other',
        accept: 'application/json',
      },
      { extra: stripExtra },
    );
    expect(stripped).toEqual({ accept: 'application/json' });
  });
});
