import { maxTimerMs } from './sleep.js';

/**
 * 64 KiB: an error page or a problem is far smaller, and reading this much costs less than a new
 * connection (a TCP handshake, and a TLS one on https). A longer body is cheaper to give up.
 */
export const drainCapBytes = 64 * 2 ** 10;

/**
 * Reads a response body that nobody will look at (a retried answer under `parse: 'none'`) to its
 * end, so that its connection goes back to the pool. Cancelling it instead makes undici close the
 * socket whenever the body has not fully arrived yet (it then opens a spare connection for the next
 * attempt too: 9 connections for 5 attempts). A body declared longer than `capBytes`, or that runs
 * past it, is cancelled there; so is one still unfinished after `timeMs` (a body that stalls must
 * not hold the retry), or at `cancel()`. The promise never rejects: a body that breaks off only
 * costs its connection.
 *
 * @example
 * const drain = drainBody(response, drainCapBytes, 10_000);
 * await drain.done;
 */
export function drainBody(
  response: Response,
  capBytes: number,
  timeMs: number,
): { done: Promise<void>; cancel: () => void } {
  const body = response.body;
  if (body === null || body.locked) return { done: Promise.resolve(), cancel: () => undefined };
  const declared = Number(response.headers.get('content-length') ?? Number.NaN);
  if (declared > capBytes) {
    body.cancel().catch(() => undefined);
    return { done: Promise.resolve(), cancel: () => undefined };
  }
  const reader = body.getReader();
  let finished = false;
  const cancel = () => {
    if (finished) return;
    finished = true;
    reader.cancel().catch(() => undefined);
  };
  const timer = Number.isFinite(timeMs) && timeMs <= maxTimerMs ? setTimeout(cancel, Math.max(0, timeMs)) : undefined;
  const done = (async () => {
    let total = 0;
    try {
      while (!finished) {
        const { done: ended, value } = await reader.read();
        if (ended) {
          // undici gives the socket back to its pool a turn after the last chunk is read: a request
          // sent in the same turn would open another connection.
          await new Promise((resolve) => setTimeout(resolve, 0));
          break;
        }
        total += value.byteLength;
        if (total > capBytes) {
          cancel();
          break;
        }
      }
    } catch {
      // Broken off, or aborted by the caller's signal: the connection is gone either way.
    } finally {
      finished = true;
      clearTimeout(timer);
    }
  })();
  return { done, cancel };
}
