// An interrupted run leaves nothing behind. Ctrl-C reaches every process of the terminal's group, the
// servers under test included, and a signal ends a Node process without its 'exit' listeners or its
// cleanup: the Redis suite's own redis-server was left running, and a server's keys left in Redis.
import { execFileSync, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { staleBuilds } from '../lib/built.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startChild } from '../lib/child-process.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { deleteRedisKeys, ioredisClient } from '../servers/backends.mjs';

const root = fileURLToPath(new URL('../..', import.meta.url));

// The pids of `pid`'s children whose command is `command` (any command when undefined: Node names
// its process after its main thread), leaving out those whose arguments match `except`.
function childrenOf(pid: number, command?: string, except?: RegExp): number[] {
  const table = execFileSync('ps', ['-eo', 'pid=,ppid=,comm=,args='], { encoding: 'utf8' });
  return table
    .trim()
    .split('\n')
    .map((line) => line.trim().split(/\s+/))
    .filter(([, ppid, comm, ...args]) => {
      if (Number(ppid) !== pid || (command !== undefined && comm !== command)) return false;
      return except === undefined || !except.test(args.join(' '));
    })
    .map(([own]) => Number(own));
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

// True once `check` held (looked at every 50 ms), false when `ms` passed first. It is not asked
// again after it held: what it found (a pid) stays the one it found.
const until = async (check: () => boolean, ms: number) => {
  const end = Date.now() + ms;
  for (;;) {
    if (check()) return true;
    if (Date.now() >= end) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
};

// The Redis suite loads @idem/core and @idem/redis as built (their dist), and a fresh clone has none:
// without them it fails before it starts its redis-server, and there is nothing to interrupt.
function buildRedisSuitePackages() {
  const needed = new Set(['@idem/core', '@idem/redis']);
  const missing = staleBuilds(root).filter((name: string) => needed.has(name));
  if (missing.length === 0) return;
  const workspaces = missing.flatMap((name: string) => ['-w', `packages/${name.slice('@idem/'.length)}`]);
  execFileSync('npm', ['run', 'build', ...workspaces], { cwd: root, stdio: 'ignore' });
}

describe('an interrupted run', () => {
  beforeAll(buildRedisSuitePackages, 180_000);

  it("stops the Redis suite's redis-server", async () => {
    const runner = spawn(
      process.execPath,
      ['benchmarks/run.mjs', '--no-build', '--match', 'redisStore', 'stores-redis'],
      {
        cwd: root,
        stdio: 'ignore',
      },
    );
    let main: number | undefined;
    let redisServer: number | undefined;
    try {
      // run.mjs starts main.mjs, which starts redis-server.
      const found = await until(() => {
        main = childrenOf(runner.pid as number)[0];
        // The suite first asks `redis-server --version` whether it is installed: not the server.
        redisServer = main === undefined ? undefined : childrenOf(main, 'redis-server', /--version/)[0];
        return redisServer !== undefined;
      }, 30_000);
      expect(found).toBe(true);
      runner.kill('SIGTERM');
      expect(await until(() => !alive(redisServer as number), 5_000)).toBe(true);
    } finally {
      for (const pid of [main, redisServer]) if (pid !== undefined && alive(pid)) process.kill(pid, 'SIGKILL');
      runner.kill('SIGKILL');
    }
  }, 60_000);

  it('lets a server delete what it stored when Ctrl-C reaches it', async () => {
    const keyPrefix = `idem-bench-key:${randomUUID()}:`;
    const server = await startChild('serve.mjs', {
      kind: 'charges',
      framework: 'express',
      variant: 'express-idempotency',
      store: 'redis',
      keyPrefix,
    });
    const redis = await ioredisClient();
    try {
      const answer = await fetch(`http://127.0.0.1:${server.message.port}/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': `${keyPrefix}one` },
        body: '{"amount":1}',
      });
      await answer.arrayBuffer();
      expect((await redis.keys(`${keyPrefix}*`)).length).toBeGreaterThan(0);
      process.kill(server.pid, 'SIGINT');
      expect(await until(() => !alive(server.pid), 10_000)).toBe(true);
      expect(await redis.keys(`${keyPrefix}*`)).toEqual([]);
    } finally {
      await server.stop();
      await deleteRedisKeys(redis, keyPrefix);
      redis.disconnect();
    }
  }, 30_000);
});
