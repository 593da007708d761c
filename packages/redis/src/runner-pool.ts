import type { RedisCommandRunner } from './redis-command-runner.js';

/**
 * One runner over several, each with a connection of its own: every command, or pipeline, goes to the
 * one with the fewest of the store's commands in flight (ties: the next in turn). Why: `WAIT` blocks
 * the connection it is sent on, so on one connection every command queues behind every waiting
 * write; here a write held by its `WAIT` holds its own runner, and the others keep serving reads and
 * other writes. A pipeline (a write and its `WAIT`) leaves whole on the runner it was given to.
 *
 * Only what this runner sent is counted: a runner whose commands hang (its connection down, and
 * ioredis queueing them) keeps its count up, and is chosen only once every other one is as busy.
 *
 * @example
 * const runner = runnerPool([redisCommandRunner(a), redisCommandRunner(b)]);
 * await runner.send('idem:k', ['GET', 'idem:k']); // on a, or on b if a is busier
 */
export function runnerPool(runners: readonly RedisCommandRunner[]): RedisCommandRunner {
  const inFlight = runners.map(() => 0);
  let next = 0;
  // The least busy, looking from `next` on so that equally busy runners take turns.
  const pick = (): number => {
    let best = next;
    for (let step = 1; step < runners.length; step++) {
      const index = (next + step) % runners.length;
      if ((inFlight[index] as number) < (inFlight[best] as number)) best = index;
    }
    next = (best + 1) % runners.length;
    return best;
  };
  const lend = async <T>(task: (runner: RedisCommandRunner) => Promise<T>): Promise<T> => {
    const index = pick();
    inFlight[index] = (inFlight[index] as number) + 1;
    try {
      return await task(runners[index] as RedisCommandRunner);
    } finally {
      inFlight[index] = (inFlight[index] as number) - 1;
    }
  };
  const pool: RedisCommandRunner = { send: (key, args) => lend((runner) => runner.send(key, args)) };
  // Only when every runner can: a pool where some could not would fail waitForReplicas now and then.
  if (runners.every((runner) => typeof runner.sendPipeline === 'function')) {
    pool.sendPipeline = (key, commands) =>
      lend((runner) =>
        (runner.sendPipeline as NonNullable<RedisCommandRunner['sendPipeline']>).call(runner, key, commands),
      );
  }
  return pool;
}
