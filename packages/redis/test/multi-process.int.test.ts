import { type ChildProcess, fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type LocalRedisCluster, startRedisCluster } from './cluster.js';
import { deleteKeys, redisAvailable, redisBinariesAvailable, redisUrl } from './redis-env.js';

const withRedis = await redisAvailable();
const withBinaries = await redisBinariesAvailable();

const PROCESSES = 4;
const CONCURRENCY = 50;
const worker = fileURLToPath(new URL('./contender-worker.ts', import.meta.url));
const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
const prefix = `idem-test:multi-process:${randomUUID()}:`;

interface Target {
  url?: string;
  clusterNodes?: Array<{ host: string; port: number }>;
}

const once = <T>(child: ChildProcess, type: string) =>
  new Promise<T>((resolve, reject) => {
    const onMessage = (message: { type?: string }) => {
      if (message?.type !== type) return;
      child.off('exit', onExit);
      child.off('message', onMessage);
      resolve(message as T);
    };
    const onExit = (code: number | null) => reject(new Error(`worker exited with ${code} before "${type}"`));
    child.on('message', onMessage);
    child.once('exit', onExit);
  });

const exitCode = (child: ChildProcess) =>
  new Promise<number | null>((resolve) => {
    if (child.exitCode !== null) resolve(child.exitCode);
    else child.once('exit', (code) => resolve(code));
  });

/** Forks the workers, starts them together, and returns every outcome they saw. */
async function contend(target: Target, sub: string): Promise<{ outcomes: string[]; counterKey: string }> {
  const key = randomUUID();
  const counterKey = `${prefix}${sub}:executions:${key}`;
  const config = JSON.stringify({ ...target, prefix: `${prefix}${sub}:`, key, counterKey, concurrency: CONCURRENCY });
  const children = Array.from({ length: PROCESSES }, () =>
    fork(worker, [config], {
      cwd: repoRoot,
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    }),
  );
  try {
    const done = children.map((child) => once<{ outcomes: string[] }>(child, 'done'));
    await Promise.all(children.map((child) => once(child, 'ready')));
    // Everyone is connected before anyone starts, so the 200 begins really overlap.
    for (const child of children) child.send('go');
    const outcomes = (await Promise.all(done)).flatMap((message) => message.outcomes);
    expect(await Promise.all(children.map(exitCode))).toEqual(Array(PROCESSES).fill(0));
    return { outcomes, counterKey };
  } finally {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
  }
}

const expectExactlyOnce = (outcomes: string[], executions: string | null) => {
  expect(outcomes).toHaveLength(PROCESSES * CONCURRENCY);
  expect(executions).toBe('1');
  expect(outcomes.filter((o) => o === 'execute')).toHaveLength(1);
  // Zero errors: every other request saw the first one in progress, or its replay.
  expect(outcomes.filter((o) => o !== 'execute' && o !== 'in_progress' && o !== 'replay')).toEqual([]);
};

describe.runIf(withRedis)(`${PROCESSES} processes x ${CONCURRENCY} concurrent requests, one key, single Redis`, () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  it('executes exactly once', async () => {
    const { outcomes, counterKey } = await contend({ url: redisUrl }, 'single');
    expectExactlyOnce(outcomes, await admin.get(counterKey));
  });
});

describe.runIf(withBinaries)(
  `${PROCESSES} processes x ${CONCURRENCY} concurrent requests, one key, Redis Cluster`,
  () => {
    let cluster: LocalRedisCluster;
    let admin: Cluster;
    beforeAll(async () => {
      cluster = await startRedisCluster();
      admin = new Cluster([...cluster.nodes]);
    });
    afterAll(async () => {
      await admin?.quit();
      await cluster?.stop();
    });

    it('executes exactly once', async () => {
      const { outcomes, counterKey } = await contend({ clusterNodes: [...cluster.nodes] }, 'cluster');
      expectExactlyOnce(outcomes, await admin.get(counterKey));
    });
  },
);
