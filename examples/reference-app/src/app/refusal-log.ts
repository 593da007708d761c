import { type CountedLinesOptions, countedLines } from '../counted-lines.js';
import type { ReportedError } from './reported-error.js';

/** What {@link refusalLogger} needs. */
export type RefusalLoggerOptions = CountedLinesOptions;

/** The logger {@link refusalLogger} makes. */
export interface RefusalLogger {
  /** Counts one refused refresh (and writes its line when one is due). */
  note(error: ReportedError): void;
  /** Writes the line of what was counted since the last one, if anything, and stops its timer. */
  flush(): void;
}

/**
 * Tells an operator about refreshes the provider refused for another reason than the grant (the
 * third-party app's `refresh-refused`). A client secret rotated at the provider only refuses every
 * session's refresh, at every request that finds its token due: one line each would bury the log
 * under the same sentence. So they are counted, as the receiver counts refused webhook deliveries
 * (rejections.ts): the first goes out at once, then at most one line per `everyMs` with how many of
 * each OAuth code came in since and the last one's status and message (the last of them written by a
 * timer, so a burst that stops is still told). Never a token: the errors are already without it.
 *
 * @example
 * ```ts
 * const refusals = refusalLogger({ write: (line) => console.warn(line) });
 * refusals.note(error);
 * // third-party app: the provider refused 1 refresh (invalid_client 1; the last HTTP 401: ...); ...
 * ```
 */
export function refusalLogger(options: RefusalLoggerOptions): RefusalLogger {
  let last: ReportedError | undefined;
  let invalidClient = false;
  const lines = countedLines(options, ({ total, parts }) => {
    // A wrong client secret is the likeliest cause, and the operator's to fix: said when it is one.
    const hint = invalidClient ? "; is the app's client secret the provider's?" : '';
    const reason = `the last HTTP ${last?.status ?? '?'}: ${last?.message}`;
    last = undefined;
    invalidClient = false;
    return `third-party app: the provider refused ${total} ${total === 1 ? 'refresh' : 'refreshes'} (${parts}; ${reason}); the sessions keep their tokens${hint}`;
  });
  return {
    note(error) {
      // Kept before the count, which may write the line at once. The code was checked where it came
      // from (a challenge's shape) or is the provider's JSON: the count writes only a code's shape.
      last = error;
      if (error.error === 'invalid_client') invalidClient = true;
      lines.count(error.error);
    },
    flush: lines.flush,
  };
}
