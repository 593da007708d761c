import { afterAll } from 'vitest';

/**
 * The servers a suite needs, started by the first call of the function returned and stopped after
 * the calling suite. Started on first use rather than in a beforeAll: describeStore's store
 * factories run inside its tests, and a suite that every test skips starts nothing.
 *
 * @example
 * const local = startedOnFirstUse(startReplicatedRedis);
 * const { primary } = await local();
 */
export function startedOnFirstUse<T extends { stop(): Promise<unknown> }>(start: () => Promise<T>): () => Promise<T> {
  let starting: Promise<T> | undefined;
  afterAll(async () => {
    const started = await starting?.catch(() => undefined);
    await started?.stop();
  });
  return () => {
    starting ??= start();
    return starting;
  };
}
