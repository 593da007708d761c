import type { Store, StoreRecord } from './store.js';

/**
 * The engine's wait for a key in progress elsewhere (the `wait` option): polls the store for the
 * record, 10 ms doubling to 250 ms, with one poll loop per record for all of this process's waiters.
 */
export function outcomePolls({
  store,
  withTimeout,
  elapsed,
}: {
  store: Pick<Store, 'get'>;
  withTimeout: <T>(operation: string, work: () => T | Promise<T>) => Promise<T>;
  elapsed: () => number;
}) {
  // One poll loop per record being waited on, shared by every waiter in this process.
  const polls = new Map<string, Promise<StoreRecord | undefined>>();

  // Waits (sharing one poll loop per record) until the record is no longer held by a live lease
  // (completed, abandoned or gone) or the deadline passes. Resolves to the last record seen.
  const waitForOutcome = (id: string, deadline: number): Promise<StoreRecord | undefined> => {
    const existing = polls.get(id);
    if (existing) return existing;
    const poll = (async () => {
      let delay = 10;
      for (;;) {
        await new Promise((resolve) => setTimeout(resolve, delay));
        const record = await withTimeout('get', () => store.get(id));
        if (record === undefined || record.state !== 'in_progress') return record;
        if (elapsed() + delay >= deadline) return record;
        delay = Math.min(delay * 2, 250);
      }
    })().finally(() => polls.delete(id));
    polls.set(id, poll);
    return poll;
  };
  return waitForOutcome;
}
