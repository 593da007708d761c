// One of the processes of multi-process.int.test.ts: connects its own client, builds its own engine
// over a redisStore, waits for "go", then sends `concurrency` begin calls with one key at once.
// The side effect of an execution is an INCR in Redis itself, so the parent can count executions
// across processes without trusting any of them.
import { createIdempotency } from '@idem/core';
import { Cluster, Redis } from 'ioredis';
import { redisStore } from '../src/index.js';

interface Config {
  url?: string;
  clusterNodes?: Array<{ host: string; port: number }>;
  prefix: string;
  key: string;
  counterKey: string;
  concurrency: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as Config;
const client = config.clusterNodes
  ? new Cluster(config.clusterNodes)
  : new Redis(config.url ?? 'redis://127.0.0.1:6379');
const engine = createIdempotency({ store: redisStore({ client, prefix: config.prefix }) });
const send = (message: unknown) => new Promise<void>((resolve) => process.send?.(message, () => resolve()));

const attempt = async (): Promise<string> => {
  try {
    const started = await engine.begin({
      key: config.key,
      scope: 'user:1',
      operation: 'POST /charges',
      fingerprint: 'fp',
    });
    if (started.kind === 'replay') return 'replay';
    if (started.kind === 'reject') return started.error.code;
    const count = await client.incr(config.counterKey);
    const completed = await engine.complete(started.lease, {
      status: 201,
      headers: { 'content-type': 'text/plain' },
      body: new TextEncoder().encode(String(count)),
    });
    return completed.ok ? 'execute' : `complete-failed:${completed.reason}`;
  } catch (error) {
    return `thrown:${error instanceof Error ? error.name : String(error)}`;
  }
};

process.on('message', async (message) => {
  if (message !== 'go') return;
  const outcomes = await Promise.all(Array.from({ length: config.concurrency }, attempt));
  await send({ type: 'done', outcomes });
  await client.quit();
  process.disconnect?.();
});

await client.ping();
await send({ type: 'ready' });
