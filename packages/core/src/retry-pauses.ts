/**
 * Runs `attempt` until it succeeds; when it fails with an error `retryable` accepts, runs it again
 * after a pause (250 ms, doubling up to 2 s), for at most `budgetMs` in all, timed on a monotonic
 * clock (a wall clock stepped meanwhile must not stretch or cut the budget). Past the budget, or on
 * any other error, rejects with that error. For steps that give up on purpose and are worth another
 * try: a migration whose DDL gave up waiting for a table's lock (`lock_timeout`), so that the queue
 * behind it is free between tries.
 *
 * @example
 * await retryWithPauses(() => migrateOnce(pool), { retryable: (error) => codeOf(error) === '55P03', budgetMs: 30_000 });
 */
export async function retryWithPauses<T>(
  attempt: () => Promise<T>,
  options: { retryable: (error: unknown) => boolean; budgetMs: number },
): Promise<T> {
  const started = performance.now();
  for (let tries = 1; ; tries++) {
    try {
      return await attempt();
    } catch (error) {
      if (!options.retryable(error)) throw error;
      const pause = Math.min(250 * 2 ** (tries - 1), 2_000);
      if (performance.now() - started + pause >= options.budgetMs) throw error;
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }
}
