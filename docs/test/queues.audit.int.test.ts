// Audit: the function-level engine behind queue consumers (RabbitMQ, NATS JetStream, SQS), as a
// Powertools `makeIdempotent` user moving to idem would use it. At-least-once delivery is simulated
// (a redelivery is the same call again; a crashed consumer is an engine that stops renewing, its
// lease then ended through the store as its clock would end it), against the memory store and the
// real Redis and PostgreSQL: what the engine does is the same whichever broker delivered the message.
// The wrapper is `makeIdempotent` of @idem/core, which docs/guides/queues.md documents (it was a
// block of that page that users copied, compiled from the page here until the package exported it).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  createIdempotency,
  type IdempotencyEngine,
  type IdempotencyOptions,
  type IdempotentRun,
  isIdempotencyError,
  makeIdempotent,
  memoryStore,
  recordId,
  type Store,
} from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { claimKeepMs } from '../../packages/redis/src/record-codec.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the queue audit on Redis');
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the queue audit on PostgreSQL',
);

/** A `ts` block of a page, found by a line it contains. */
function blockWith(page: string, needle: string): string {
  const text = readFileSync(join(root, 'docs', page), 'utf8');
  for (const match of text.matchAll(/^```ts[^\n]*\n([\s\S]*?)^```\s*$/gm)) {
    if ((match[1] as string).includes(needle)) return match[1] as string;
  }
  throw new Error(`docs/${page} has no ts block with ${needle}`);
}

type Order = { id: string; amount: number };
type ProcessOrder = (order: Order) => Promise<unknown>;

// docs/migrating.md, "From Powertools", the After block: its `processOrder` as on the page, over an
// engine and a `chargeCard` the test gives it, with the package's `makeIdempotent`.
function migratingRecipe(engine: IdempotencyEngine, chargeCard: (order: Order) => Promise<unknown>): ProcessOrder {
  const block = blockWith('migrating.md', 'export const processOrder = makeIdempotent(');
  const fn = block.slice(block.indexOf('export const processOrder')).replace(/^export /, '');
  const js = ts.transpileModule(`${fn}\nreturn processOrder;`, {
    compilerOptions: { target: ts.ScriptTarget.ES2023 },
  }).outputText;
  return new Function('engine', 'chargeCard', 'makeIdempotent', js)(engine, chargeCard, makeIdempotent);
}

describe("docs/migrating.md's From Powertools recipe, with a redelivered message", () => {
  it('a function that returns nothing (the usual consumer) replays nothing on redelivery', async () => {
    const engine = createIdempotency({ store: memoryStore() });
    let runs = 0;
    const processOrder = migratingRecipe(engine, async () => {
      runs++;
    });
    const order = { id: 'order-1', amount: 5 };
    expect(await processOrder(order)).toBeUndefined();
    // The redelivery must get the first outcome, not a SyntaxError from JSON.parse('').
    expect(await processOrder(order)).toBeUndefined();
    expect(runs).toBe(1);
  });

  it('a result the recipe cannot store does not run the charge again on redelivery', async () => {
    const engine = createIdempotency({ store: memoryStore() });
    let runs = 0;
    const processOrder = migratingRecipe(engine, async () => {
      runs++;
      return { chargeId: 'ch_1', amountMinor: 500n }; // JSON.stringify throws on a BigInt
    });
    const order = { id: 'order-2', amount: 5 };
    await expect(processOrder(order)).rejects.toMatchObject({ code: 'response_not_replayable' });
    // The charge happened: the redelivery must not make it again.
    await expect(processOrder(order)).rejects.toMatchObject({ code: 'response_not_replayable' });
    expect(runs).toBe(1);
  });
});

// ---- makeIdempotent, as docs/guides/queues.md documents it ----

type Run = IdempotentRun;

/** A store, a way to end a lease as its own clock would, and its cleanup. */
interface Backend {
  name: string;
  available: boolean;
  open(): Promise<{ store: Store; endLease(id: string): Promise<void>; close(): Promise<void> }>;
}

const prefix = `audit-queues:${process.pid}:${Date.now()}:`;

const backends: Backend[] = [
  {
    name: 'memory store',
    available: true,
    async open() {
      // The memory store times leases by its injected clock: ending one is moving that clock on.
      let offset = 0;
      const store = memoryStore({ now: () => Date.now() + offset });
      return {
        store,
        endLease: async () => {
          offset += 60_000;
        },
        close: async () => {},
      };
    },
  },
  {
    name: 'Redis',
    available: withRedis,
    async open() {
      const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
      await client.connect();
      const store = redisStore({ client, prefix });
      return {
        store,
        // What the server's clock does when a lease runs out: the key lives on for the claim's keep.
        endLease: async (id) => {
          const key = store.key(id);
          const value = await client.getBuffer(key);
          if (value === null) throw new Error('no record to end the lease of');
          await client.pexpire(key, claimKeepMs(value));
        },
        close: async () => {
          let cursor = '0';
          do {
            const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
            cursor = next;
            if (keys.length > 0) await client.unlink(...keys);
          } while (cursor !== '0');
          client.disconnect();
        },
      };
    },
  },
  {
    name: 'PostgreSQL',
    available: withPostgres,
    async open() {
      const pool = new pg.Pool({ connectionString: databaseUrl, max: 10 });
      pool.on('error', () => undefined);
      const table = `audit_queues_${process.pid}_${Date.now()}`;
      await migrate(pool, { table });
      const store = postgresStore({ client: pool, table });
      return {
        store,
        // The database clock running the lease out (as the package's test harness does).
        endLease: async (id) => {
          await pool.query(
            `UPDATE "${table}" SET
               lease_until = clock_timestamp() - interval '1 millisecond',
               expires_at = clock_timestamp() - interval '1 millisecond' + (expires_at - lease_until)
             WHERE id = $1`,
            [id],
          );
        },
        close: async () => {
          await pool.query(`DROP TABLE IF EXISTS "${table}"`);
          await pool.end();
        },
      };
    },
  },
];

/** Resolves when `check` holds, polling (never a fixed sleep); fails after `ms`. */
async function until(check: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const order = (id: string, amount = 5): Order => ({ id, amount });
const wrap = <R>(engine: IdempotencyEngine, handler: (message: Order, run: Run) => Promise<R>) =>
  makeIdempotent(handler, {
    engine,
    operation: 'processOrder',
    key: (message: Order) => message.id,
    payload: (message: Order) => JSON.stringify(message),
  });

let sequence = 0;
const freshId = () => `order-${process.pid}-${Date.now()}-${++sequence}`;

for (const backend of backends) {
  describe.skipIf(!backend.available)(`makeIdempotent on the ${backend.name}`, () => {
    let opened: Awaited<ReturnType<Backend['open']>>;
    const engines: IdempotencyEngine[] = [];
    // One engine per simulated consumer process: its own heartbeat, its own leases in hand.
    const consumer = (options: Partial<IdempotencyOptions> = {}) => {
      const engine = createIdempotency({ store: opened.store, storeOutcome: 'stripe', ...options });
      engines.push(engine);
      return engine;
    };

    beforeAll(async () => {
      opened = await backend.open();
    }, 30_000);
    afterAll(async () => {
      await opened?.close();
    });

    it('a redelivery after completion gets the stored result; the handler does not run', async () => {
      let runs = 0;
      const handle = wrap(consumer(), async (message) => {
        runs++;
        return { charged: message.amount };
      });
      const message = order(freshId());
      expect(await handle(message)).toEqual({ charged: 5 });
      // Another consumer process gets the redelivery.
      const other = wrap(consumer(), async () => {
        runs++;
        return { charged: -1 };
      });
      expect(await other(message)).toEqual({ charged: 5 });
      expect(runs).toBe(1);
    });

    it('a redelivery while the first consumer still runs gets in_progress, retryable, with a retryAfter', async () => {
      let release = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      let runs = 0;
      const first = wrap(consumer(), async () => {
        runs++;
        await gate;
        return 'done';
      });
      const message = order(freshId());
      const running = first(message);
      await until(() => runs === 1);
      const second = wrap(consumer(), async () => {
        runs++;
        return 'again';
      });
      const refused = await second(message).catch((error: unknown) => error);
      expect(isIdempotencyError(refused) && refused.code).toBe('in_progress');
      expect(isIdempotencyError(refused) && refused.retryable).toBe(true);
      expect(isIdempotencyError(refused) && refused.retryAfter).toBe(1);
      release();
      expect(await running).toBe('done');
      // Redelivered after retryAfter: the result, no second run.
      expect(await second(message)).toBe('done');
      expect(runs).toBe(1);
    });

    it('with wait, the redelivery of a live run waits for its result instead of in_progress', async () => {
      let release = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      let runs = 0;
      const first = wrap(consumer(), async () => {
        runs++;
        await gate;
        return 'done';
      });
      const message = order(freshId());
      const running = first(message);
      await until(() => runs === 1);
      const second = wrap(consumer({ wait: '15s' }), async () => {
        runs++;
        return 'again';
      });
      const waiting = second(message);
      release();
      expect(await waiting).toBe('done');
      expect(await running).toBe('done');
      expect(runs).toBe(1);
    });

    it('a consumer that crashed mid-handler: with wait, the redelivery takes the key over once the lease ends', async () => {
      // The crashed consumer: it claimed, started its effect, and died (nothing renews its lease).
      const crashed = consumer({ heartbeat: false });
      const message = order(freshId());
      let crashedRuns = 0;
      const dying = wrap(crashed, async () => {
        crashedRuns++;
        return new Promise<never>(() => {}); // never settles: the process is gone
      });
      void dying(message);
      await until(() => crashedRuns === 1);
      let recovered: boolean | undefined;
      let aborted: boolean | undefined;
      const survivor = wrap(consumer({ wait: '15s' }), async (_message, run) => {
        recovered = run.recovered;
        aborted = run.signal.aborted;
        return 'redone';
      });
      const redelivered = survivor(message);
      // The lease runs out (the store's clock), while the redelivery waits.
      await opened.endLease(recordId('', 'processOrder', message.id));
      expect(await redelivered).toBe('redone');
      expect(recovered).toBe(true);
      // Its own lease, fresh from its claim (packages/core/test/wait-takeover.audit.test.ts).
      expect(aborted).toBe(false);
    }, 30_000);

    it('duplicates at once on several consumers: the handler runs once, every copy gets its result', async () => {
      let runs = 0;
      const message = order(freshId());
      const copies = Array.from({ length: 6 }, () =>
        wrap(consumer({ wait: '15s' }), async () => {
          runs++;
          await new Promise((resolve) => setTimeout(resolve, 50));
          return { charged: 5 };
        })(message),
      );
      const results = await Promise.all(copies);
      expect(results).toEqual(Array(6).fill({ charged: 5 }));
      expect(runs).toBe(1);
    }, 30_000);

    it('a thrown handler under storeOutcome stripe: the redelivery runs it again (as Powertools)', async () => {
      let runs = 0;
      const handle = wrap(consumer(), async () => {
        runs++;
        if (runs === 1) throw new Error('database down');
        return 'ok';
      });
      const message = order(freshId());
      await expect(handle(message)).rejects.toThrow('database down');
      expect(await handle(message)).toBe('ok');
      expect(runs).toBe(2);
    });

    it("a thrown handler under storeOutcome 'all': the redelivery gets the failure, replayed, without running", async () => {
      let runs = 0;
      const handle = wrap(consumer({ storeOutcome: 'all' }), async () => {
        runs++;
        throw new RangeError('card declined');
      });
      const message = order(freshId());
      await expect(handle(message)).rejects.toThrow('card declined');
      const replayed = await handle(message).catch((error: unknown) => error);
      expect(replayed).toBeInstanceOf(Error);
      expect((replayed as Error).name).toBe('RangeError');
      expect((replayed as Error).message).toBe('card declined');
      expect(runs).toBe(1);
    });

    it('the same key with another payload (a producer bug) is refused: fingerprint_mismatch, not retryable', async () => {
      const engine = consumer();
      const id = freshId();
      let runs = 0;
      const handle = wrap(engine, async () => {
        runs++;
        return 'ok';
      });
      await handle(order(id, 5));
      const refused = await handle(order(id, 7)).catch((error: unknown) => error);
      expect(isIdempotencyError(refused) && refused.code).toBe('fingerprint_mismatch');
      expect(isIdempotencyError(refused) && refused.retryable).toBe(false);
      expect(runs).toBe(1);
    });

    it('a payload that is not JSON (bytes) is fingerprinted as bytes; the result is bytes too', async () => {
      type Raw = { id: string; content: Buffer };
      let runs = 0;
      const handle = makeIdempotent(
        async (message: Raw) => {
          runs++;
          return Buffer.concat([Buffer.from([0xff, 0x00]), message.content]);
        },
        { engine: consumer(), operation: 'raw', key: (m: Raw) => m.id, payload: (m: Raw) => m.content },
      );
      const id = freshId();
      const content = Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x00, 0xff]);
      const first = await handle({ id, content });
      const replayed = await handle({ id, content: Buffer.from(content) });
      expect(Buffer.isBuffer(replayed)).toBe(true);
      expect(Buffer.compare(replayed, first)).toBe(0);
      const other = await handle({ id, content: Buffer.from([0xde, 0xad]) }).catch((error: unknown) => error);
      expect(isIdempotencyError(other) && other.code).toBe('fingerprint_mismatch');
      expect(runs).toBe(1);
    });

    it('results that are not HTTP responses replay as the guide says', async () => {
      class Receipt {
        constructor(
          readonly id: string,
          readonly cents: number,
        ) {}
        get euros() {
          return this.cents / 100;
        }
      }
      const when = new Date('2026-01-02T03:04:05.678Z');
      const cases: Array<[string, () => unknown, unknown]> = [
        ['undefined', () => undefined, undefined],
        ['null', () => null, null],
        ['a string', () => 'text', 'text'],
        ['a number', () => 0, 0],
        ['a plain object', () => ({ a: [1, { b: true }] }), { a: [1, { b: true }] }],
        ['a Date', () => when, when.toISOString()],
        ['a class instance', () => new Receipt('r1', 250), { id: 'r1', cents: 250 }],
        ['a Map', () => new Map([['a', 1]]), {}],
      ];
      for (const [label, result, replay] of cases) {
        let runs = 0;
        const handle = wrap(consumer(), async () => {
          runs++;
          return result();
        });
        const message = order(freshId());
        await handle(message);
        expect(await handle(message), label).toEqual(replay);
        expect(runs, label).toBe(1);
      }
    });

    it('a result that cannot be stored: a clear error after the effect, and no second run on redelivery', async () => {
      for (const [label, result] of [
        ['a BigInt', () => ({ cents: 5n })],
        [
          'a cycle',
          () => {
            const node: { self?: unknown } = {};
            node.self = node;
            return node;
          },
        ],
        ['a function', () => () => 1],
        ['a result over maxResultBytes', () => 'x'.repeat(2 * 1024 * 1024)],
      ] as const) {
        let runs = 0;
        const handle = wrap(consumer(), async () => {
          runs++;
          return result();
        });
        const message = order(freshId());
        const first = await handle(message).catch((error: unknown) => error);
        expect(isIdempotencyError(first) && first.code, label).toBe('response_not_replayable');
        const again = await handle(message).catch((error: unknown) => error);
        expect(isIdempotencyError(again) && again.code, label).toBe('response_not_replayable');
        expect(runs, label).toBe(1);
      }
    });

    it('a lost lease: the signal aborts with lease_lost, retryable; the redelivery takes the key over', async () => {
      // maxExecution stands for any lost lease: renewals stop, the signal aborts at once.
      const engine = consumer({ maxExecution: '100ms', lease: '400ms' });
      const message = order(freshId());
      let runs = 0;
      const handle = wrap(engine, async (_message, run) => {
        runs++;
        if (runs > 1) return 'second';
        await new Promise((_resolve, reject) => {
          run.signal.addEventListener('abort', () => reject(run.signal.reason), { once: true });
        });
        return 'never';
      });
      const lost = await handle(message).catch((error: unknown) => error);
      expect(isIdempotencyError(lost) && lost.code).toBe('lease_lost');
      expect(isIdempotencyError(lost) && lost.retryable).toBe(true);
      // Settled as a crash: the lease is ended at once (a millisecond on), and the redelivery takes
      // the key over. (Ended here too, as time would: the memory store's clock is the test's.)
      await opened.endLease(recordId('', 'processOrder', message.id));
      expect(await handle(message)).toBe('second');
      expect(runs).toBe(2);
    }, 30_000);
  });
}
