import type { ClientOptions } from './client-options.js';
import { maxTimerMs } from './sleep.js';

/**
 * How {@link awaitToken} ended: with what getToken gave, or cut short by the caller's abort or the deadline.
 *
 * @example
 * const run: TokenRun = { kind: 'deadline' };
 */
export type TokenRun =
  | { kind: 'token'; token: string | null | undefined }
  | { kind: 'aborted'; reason: unknown }
  | { kind: 'deadline' };

/**
 * Calls `getToken` and waits for it, but no longer than the caller's signal allows or `remainingMs`
 * (the time left before the deadline, on a real timer like the per-attempt timeout). What getToken
 * throws or rejects with is rethrown (the caller wraps it as `token_failed`); a token that arrives
 * after the wait was cut is dropped, and so is a late rejection.
 *
 * @example
 * const run = await awaitToken(() => session.token, signal, 5_000, false);
 * if (run.kind === 'token') new Headers({ authorization: `Bearer ${run.token}` });
 */
export async function awaitToken(
  getToken: NonNullable<ClientOptions['getToken']>,
  callerSignal: AbortSignal | undefined,
  remainingMs: number,
  refresh: boolean,
): Promise<TokenRun> {
  if (callerSignal?.aborted) return { kind: 'aborted', reason: callerSignal.reason };
  let stop!: (run: TokenRun) => void;
  const stopped = new Promise<TokenRun>((resolve) => {
    stop = resolve;
  });
  const onAbort = () => stop({ kind: 'aborted', reason: callerSignal?.reason });
  callerSignal?.addEventListener('abort', onAbort, { once: true });
  // A deadline longer than one timer holds is left to the checks around the attempt.
  const timer =
    remainingMs <= maxTimerMs ? setTimeout(() => stop({ kind: 'deadline' }), Math.max(0, remainingMs)) : undefined;
  const pending = new Promise<string | null | undefined>((resolve) => resolve(getToken({ refresh })));
  try {
    return await Promise.race([pending.then((token): TokenRun => ({ kind: 'token', token })), stopped]);
  } finally {
    clearTimeout(timer);
    callerSignal?.removeEventListener('abort', onAbort);
  }
}
