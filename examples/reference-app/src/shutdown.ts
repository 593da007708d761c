/** One thing to close at shutdown, named for the error when it fails. */
export interface ShutdownStep {
  readonly name: string;
  close(): Promise<void>;
}

/**
 * Closes every step in order, each one even when an earlier one failed (a gateway that would not
 * close is no reason to leave the database open), then throws an `AggregateError` naming the steps
 * that failed, if any, so the caller can exit non-zero and a supervisor learns of it.
 *
 * @example
 * ```ts
 * await closeInOrder([
 *   { name: 'gateway', close: () => gateway.close() },
 *   { name: 'database', close: () => db.close() },
 * ]);
 * ```
 */
export async function closeInOrder(steps: readonly ShutdownStep[]): Promise<void> {
  const failed: Error[] = [];
  for (const step of steps) {
    try {
      await step.close();
    } catch (error) {
      failed.push(new Error(`closing ${step.name} failed`, { cause: error }));
    }
  }
  if (failed.length > 0) {
    throw new AggregateError(failed, `shutdown: ${failed.map((error) => error.message).join('; ')}`);
  }
}
