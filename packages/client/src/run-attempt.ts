import type { FetchFunction } from './fetch-function.js';
import { ResponseTooLarge, readCapped } from './read-capped.js';
import { lateTimeout } from './sleep.js';

/**
 * How one attempt ended, before the client judges it.
 *
 * @example
 * const run: AttemptRun = { kind: 'timeout', error, response: undefined };
 */
// `response` is set on the failures too once the headers had arrived: the status says the server ran it.
export type AttemptRun =
  | { kind: 'response'; response: Response; bytes: Uint8Array | undefined }
  | { kind: 'too-large'; response: Response }
  | { kind: 'network-error' | 'timeout'; error: unknown; response: Response | undefined }
  | { kind: 'aborted'; reason: unknown; response: Response | undefined };

/**
 * The signal an attempt's fetch runs under. While the attempt runs, the caller's abort reaches it
 * through `own` (runAttempt forwards it, and removes its listener when the attempt ends), so its own
 * signal is enough. Only with `parse: 'none'` (`bodyOutlives`) does the body outlive the attempt and
 * must still stop when the caller aborts: `AbortSignal.any` follows the caller's signal without a
 * listener on it. It is kept to that case because Node 22 (up to 22.23 at least) leaves about 170
 * bytes on a long-lived caller signal for every `AbortSignal.any` made from it, for good; where it is
 * missing (older browsers) the caller's signal stops the attempt only.
 */
function attemptSignal(
  own: AbortController,
  callerSignal: AbortSignal | undefined,
  bodyOutlives: boolean,
): AbortSignal {
  if (callerSignal === undefined || !bodyOutlives) return own.signal;
  if (typeof AbortSignal.any === 'function') return AbortSignal.any([callerSignal, own.signal]);
  return own.signal;
}

/**
 * One attempt: the fetch and, unless `maxBytes` is undefined (`parse: 'none'`), the whole body up to
 * `maxBytes`, under one timeout. A body that breaks off half way is a network error like a refused
 * connection: the outcome is unknown, though the response's headers, when they came, are kept.
 *
 * @example
 * const run = await runAttempt(fetch, url, { method: 'POST', headers, body }, 10_000, signal, 16 * 2 ** 20);
 * if (run.kind === 'response') run.response.status;
 */
export async function runAttempt(
  fetchFn: FetchFunction,
  url: string,
  init: RequestInit,
  timeoutMs: number,
  callerSignal: AbortSignal | undefined,
  maxBytes: number | undefined,
): Promise<AttemptRun> {
  const controller = new AbortController();
  let timedOut = false;
  const onCallerAbort = () => controller.abort(callerSignal?.reason);
  callerSignal?.addEventListener('abort', onCallerAbort, { once: true });
  // One turn late (see lateTimeout): an answer that arrived during a freeze of the program counts.
  const cancelTimeout = Number.isFinite(timeoutMs)
    ? lateTimeout(timeoutMs, () => {
        timedOut = true;
        controller.abort(new DOMException('The attempt timed out.', 'TimeoutError'));
      })
    : undefined;
  // A fetch that ignores its signal must still not hold the attempt past its timeout.
  const abortion = new Promise<never>((_, reject) => {
    controller.signal.addEventListener('abort', () => reject(controller.signal.reason), { once: true });
  });
  let response: Response | undefined;
  const work = (async () => {
    response = await fetchFn(url, { ...init, signal: attemptSignal(controller, callerSignal, maxBytes === undefined) });
    const bytes = maxBytes === undefined ? undefined : await readCapped(response, maxBytes);
    return { response, bytes };
  })();
  work.catch(() => undefined);
  abortion.catch(() => undefined);
  try {
    const done = await Promise.race([work, abortion]);
    return { kind: 'response', response: done.response, bytes: done.bytes };
  } catch (error) {
    if (error instanceof ResponseTooLarge && response !== undefined) return { kind: 'too-large', response };
    if (callerSignal?.aborted) return { kind: 'aborted', reason: callerSignal.reason, response };
    if (timedOut) return { kind: 'timeout', error, response };
    return { kind: 'network-error', error, response };
  } finally {
    cancelTimeout?.();
    callerSignal?.removeEventListener('abort', onCallerAbort);
  }
}
