// Model-based audit of the HTTP layer, one level above the Store model (model.audit*.ts): random
// sequences of requests from two callers over a few keys (same or other bodies, methods, routes, a
// header in the fingerprint and one that is not, handlers answering 2xx/4xx/5xx, throwing,
// streaming, too large to replay, releasing, or hanging until a later step finishes them, clients
// leaving mid-request, time moving past the lease and the retention) played against Express,
// Fastify and Koa, each answer checked against the model of DESIGN.md's table
// (audit-support/http-model.ts) and against the other two frameworks. On memory stores and on Redis
// (own prefix, its clock moved by shortening every key's PTTL, as model.audit.int.test.ts does).
import { randomBytes } from 'node:crypto';
import { memoryStore } from '@idem/core';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import {
  burstArbitrary,
  configs,
  type ModelRun,
  type Req,
  type Step,
  startModelRun,
} from './audit-support/http-model.js';
import { advanceRedisPrefix } from './audit-support/redis-clock.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the HTTP model audit over it',
);
const tag = randomBytes(4).toString('hex');
const leaseMs = 30_000;
const seed = process.env.HTTP_MODEL_SEED === undefined ? undefined : Number(process.env.HTTP_MODEL_SEED);

/** The concurrent properties, the same on every store: bursts, and retries racing after a lease ran out. */
function concurrencyProperties(runner: () => ModelRun) {
  it('bursts of concurrent requests: one run per record, replays byte-equal, 409 or 422 for the rest', async () => {
    await fc.assert(
      fc.asyncProperty(burstArbitrary, (burst) => runner().burst(burst)),
      { numRuns: 15, endOnFailure: true },
    );
  }, 120_000);

  it('a lease run out, then concurrent retries: exactly one takes the key over; the late finisher is fenced', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 1, max: 8 }), fc.integer({ min: 0, max: 4 }), (same, other) =>
        runner().takeoverBurst(same, other),
      ),
      { numRuns: 15, endOnFailure: true },
    );
  }, 120_000);
}

describe('the three adapters against the HTTP model, on memory stores', () => {
  let clock = Date.UTC(2026, 0, 1);
  let run: ModelRun;
  beforeAll(async () => {
    run = await startModelRun({
      store: () => memoryStore({ now: () => clock }),
      now: () => clock,
      advance: async (ms) => {
        clock += ms;
      },
      leaseMs,
      numRuns: 50,
      ...(seed === undefined ? {} : { seed }),
    });
  }, 30_000);
  afterAll(async () => {
    await run?.close();
  });

  for (const config of configs) {
    it(`answer as the model says, and alike: ${config.name}`, async () => {
      const figures = await run.check(config);
      console.info(`[figures] http-model memory ${config.name} ${JSON.stringify(figures)}`);
      expect(figures.requests).toBeGreaterThan(300);
      // The states the sequences must reach, or the run proves little.
      // (Rarer states, a takeover, a fenced finisher, a client gone mid-hang, have examples below.)
      for (const reached of ['replay ok', '409 in_progress', '422 fingerprint_mismatch'])
        expect(figures.coverage[reached] ?? 0, reached).toBeGreaterThan(0);
    }, 120_000);
  }

  concurrencyProperties(() => run);
});

// Counterexamples and corner cases of the random runs, minimised into plain sequences (each step's
// answers checked against the model and across the three frameworks, as in the runs).
describe('the HTTP model, minimised examples (memory stores)', () => {
  let clock = Date.UTC(2026, 0, 1);
  let run: ModelRun;
  beforeAll(async () => {
    run = await startModelRun({
      store: () => memoryStore({ now: () => clock }),
      now: () => clock,
      advance: async (ms) => {
        clock += ms;
      },
      leaseMs,
      numRuns: 1,
    });
  }, 30_000);
  afterAll(async () => {
    await run?.close();
  });
  const [withHeartbeat, minted, optional] = configs as [(typeof configs)[0], (typeof configs)[0], (typeof configs)[0]];
  const charge = (over: Partial<Req> = {}): Step => ({
    kind: 'send',
    req: {
      user: 'alice',
      key: { kind: 'field', field: 'k1' },
      endpoint: 0,
      act: 'ok',
      amount: 1,
      spaced: false,
      query: '',
      version: undefined,
      trace: 't1',
      oversized: false,
      ...over,
    },
  });

  // Was a defect: with no caller (no guard ran, no scope option) and a body over maxBodyBytes, Fastify
  // answers 413 body_too_large where Express and Koa answer 500 scope_missing: its preParsing hook
  // reads (and refuses) the body before preHandler asks for the scope, while the Express and Koa
  // adapters leave the body to begin(), which checks the caller first. Both refuse and run nothing,
  // but "one scenario table, three frameworks, identical results" does not hold. Decision needed:
  // which comes first. Asking for the scope in preParsing is not safe as it stands (a guard
  // registered as a preHandler hook has not set the principal yet, and a body left unread there is
  // not fingerprinted); Express and Koa could read the body before the scope check instead. Decided:
  // the body first, in core's handler for all three: 413 before scope_missing.
  it('no caller and a body over the limit: the same answer on the three', async () => {
    await run.play(withHeartbeat, [charge({ user: null, oversized: true })]);
  });

  it('a hang holds its key: 409 with Retry-After for the same and for another body, then the replay and 422', async () => {
    await run.play(withHeartbeat, [
      charge({ act: 'hang' }),
      charge({ act: 'hang', trace: 't2' }),
      charge({ act: 'hang', amount: 2 }),
      charge({ act: 'hang', key: { kind: 'field', field: '"k1"' }, user: 'bob' }),
      { kind: 'finish', pending: 0 },
      charge({ act: 'hang', spaced: true }),
      charge({ act: 'hang', amount: 2 }),
      { kind: 'finish', pending: 0 },
    ]);
  });

  it('a lease that runs out under a hanging handler: another body 422, the same one takes over; the late finisher is served, not stored', async () => {
    await run.play(minted, [
      charge({ act: 'hang' }),
      { kind: 'advance', ms: leaseMs + 1 },
      charge({ act: 'hang', version: 'v1' }),
      charge({ act: 'hang', trace: 't2' }),
      { kind: 'finish', pending: 0 },
      charge({ act: 'hang' }),
      { kind: 'finish', pending: 0 },
      charge({ act: 'hang' }),
    ]);
  });

  it('a recovered run the policy does not keep leaves the key abandoned: other bodies still 422, the same one runs again', async () => {
    await run.play(optional, [
      charge({ act: 'hangThrow' }),
      { kind: 'advance', ms: leaseMs + 1 },
      charge({ act: 'hangThrow', trace: 't2' }),
      { kind: 'finish', pending: 1 },
      charge({ act: 'hangThrow', amount: 2 }),
      charge({ act: 'hangThrow', trace: 't3' }),
      { kind: 'finish', pending: 0 },
      { kind: 'finish', pending: 0 },
    ]);
  });

  it('a client that leaves while its handler hangs: the outcome is stored when it finishes, and replayed', async () => {
    await run.play(withHeartbeat, [
      charge({ act: 'hang' }),
      { kind: 'abort', pending: 0 },
      charge({ act: 'hang', trace: 't2' }),
      { kind: 'finish', pending: 0 },
      charge({ act: 'hang', trace: 't3' }),
      charge({ act: 'hang', amount: 2 }),
    ]);
  });

  it('a minted key: the retry with it replays, another body under it 422, another caller runs', async () => {
    await run.play(minted, [
      charge({ key: { kind: 'none' } }),
      charge({ key: { kind: 'minted' }, trace: 't2' }),
      charge({ key: { kind: 'minted' }, amount: 2 }),
      charge({ key: { kind: 'minted' }, user: 'bob' }),
    ]);
  });
});

describe.runIf(withRedis)('the three adapters against the HTTP model, on Redis', () => {
  const prefix = `audit-httpmodel:${tag}:`;
  let clock = Date.UTC(2026, 0, 1);
  let client: Redis;
  let run: ModelRun;
  beforeAll(async () => {
    client = new Redis(redisUrl);
    run = await startModelRun({
      store: (framework, config) => redisStore({ client, prefix: `${prefix}${config.policy}:${framework}:` }),
      now: () => clock,
      advance: async (ms) => {
        clock += ms;
        await advanceRedisPrefix(client, prefix, ms);
      },
      leaseMs,
      numRuns: 20,
      ...(seed === undefined ? {} : { seed }),
    });
  }, 30_000);
  afterAll(async () => {
    await run?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  for (const config of configs) {
    it(`answer as the model says, and alike: ${config.name}`, async () => {
      const figures = await run.check(config);
      console.info(`[figures] http-model redis ${config.name} ${JSON.stringify(figures)}`);
      expect(figures.requests).toBeGreaterThan(100);
    }, 120_000);
  }

  concurrencyProperties(() => run);
});
