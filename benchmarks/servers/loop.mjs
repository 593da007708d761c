// Child process entry for function-level contenders, measured without HTTP: raw jose.jwtVerify (the
// guard's verify-path baseline) and, on the same Redis, the idem engine beside Powertools'
// makeIdempotent with its Redis (cache) persistence layer. Sends `{ opsPerSecond }` and waits for 'stop'.
import { randomUUID } from 'node:crypto';
import { onStop, receiveSpec, reportFailure } from '../lib/child-process.mjs';
import { deleteRedisKeys, ioredisClient, redisUrl } from './backends.mjs';

const spec = await receiveSpec();
const cleanups = [];

// `inFlight` callers, each awaiting one operation after the other, for `ms` of wall time.
async function rate(operation, inFlight, ms) {
  let done = 0;
  const started = performance.now();
  const until = started + ms;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < until) {
        await operation();
        done++;
      }
    }),
  );
  return Math.round(done / ((performance.now() - started) / 1_000));
}

async function joseLoop() {
  const { jwtVerify } = await import('jose');
  const { joseKey } = await import('../lib/jose-key.mjs');
  const key = await joseKey(spec);
  let index = 0;
  const options = { issuer: spec.issuer, audience: spec.audience, algorithms: [spec.alg] };
  return () => jwtVerify(spec.tokens[index++ % spec.tokens.length], key, options);
}

const response = {
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode('{"id":"ch_1","amount":1000,"currency":"usd","status":"succeeded"}'),
};

async function idemEngineLoop() {
  const { createIdempotency } = await import('@idem/core');
  const { redisStore } = await import('@idem/redis');
  const prefix = `idem-bench-fn:${randomUUID()}:`;
  let client;
  // The store takes either client; node-redis is what Powertools' Redis layer runs on, so the pair
  // with the same client compares the two libraries and not two Redis clients.
  if (spec.client === 'node-redis') {
    const { createClient } = await import('redis');
    client = await createClient({ url: redisUrl }).connect();
    cleanups.push(async () => {
      const cleaner = await ioredisClient();
      await deleteRedisKeys(cleaner, prefix);
      cleaner.disconnect();
      await client.quit();
    });
  } else {
    client = await ioredisClient();
    cleanups.push(async () => {
      await deleteRedisKeys(client, prefix);
      client.disconnect();
    });
  }
  const engine = createIdempotency({ store: redisStore({ client, prefix }) });
  const run = async (key) => {
    const started = await engine.begin({ key, scope: 'bench-caller', operation: 'charge', fingerprint: 'fp' });
    if (started.kind === 'execute') await engine.complete(started.lease, response);
    else if (started.kind !== 'replay') throw new Error(`unexpected ${started.kind}`);
    return started.kind;
  };
  if (spec.mode === 'replay') {
    await run('replayed');
    return async () => {
      if ((await run('replayed')) !== 'replay') throw new Error('expected a replay');
    };
  }
  return async () => {
    if ((await run(randomUUID())) !== 'execute') throw new Error('expected an execution');
  };
}

async function powertoolsLoop() {
  const { makeIdempotent, IdempotencyConfig } = await import('@aws-lambda-powertools/idempotency');
  const { CachePersistenceLayer } = await import('@aws-lambda-powertools/idempotency/cache');
  const { createClient } = await import('redis');
  const client = await createClient({ url: redisUrl }).connect();
  const keyPrefix = `idem-bench-powertools:${randomUUID()}`;
  cleanups.push(async () => {
    const cleaner = await ioredisClient();
    await deleteRedisKeys(cleaner, keyPrefix);
    cleaner.disconnect();
    await client.quit();
  });
  const persistenceStore = new CachePersistenceLayer({ client });
  // The charge's answer, as the idem loop stores it; the key is the event's `key` field.
  const charge = async (event) => ({
    id: `ch_${event.key}`,
    amount: event.amount,
    currency: 'usd',
    status: 'succeeded',
  });
  const config = new IdempotencyConfig({ eventKeyJmesPath: 'key', expiresAfterSeconds: 86_400 });
  const handler = makeIdempotent(charge, { persistenceStore, config, keyPrefix });
  // A Lambda-like context: Powertools reads the remaining time to size its in-progress lock.
  const context = { getRemainingTimeInMillis: () => 30_000, functionName: 'bench', awsRequestId: 'bench' };
  if (spec.mode === 'replay') {
    await handler({ key: 'replayed', amount: 1000 }, context);
    return () => handler({ key: 'replayed', amount: 1000 }, context);
  }
  return () => handler({ key: randomUUID(), amount: 1000 }, context);
}

const loops = { jose: joseLoop, 'idem-engine': idemEngineLoop, powertools: powertoolsLoop };

try {
  const makeLoop = loops[spec.kind];
  if (!makeLoop) throw new TypeError(`unknown loop ${spec.kind}`);
  const operation = await makeLoop();
  onStop(async () => {
    for (const cleanup of cleanups) await cleanup();
  });
  const inFlight = spec.inFlight ?? 50;
  await rate(operation, inFlight, Math.min(1_000, spec.durationMs)); // warm-up window, not counted
  process.send({ opsPerSecond: await rate(operation, inFlight, spec.durationMs) });
} catch (error) {
  for (const cleanup of cleanups) await cleanup().catch(() => {});
  reportFailure(error);
}
