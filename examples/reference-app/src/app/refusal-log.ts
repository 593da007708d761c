import type { ReportedError } from './reported-error.js';

/** What {@link refusalLogger} needs. */
export interface RefusalLoggerOptions {
  /** Where a line goes. */
  write: (line: string) => void;
  /** At most one line per this many ms (the first refusal goes out at once). Default 60,000. */
  everyMs?: number | undefined;
  /** Epoch ms. Default `Date.now`. */
  now?: (() => number) | undefined;
  /** Schedules the line of refusals that came in since the last one. Default `setTimeout`, unref'd. */
  schedule?: ((run: () => void, ms: number) => { cancel(): void }) | undefined;
}

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
  const everyMs = options.everyMs ?? 60_000;
  if (!Number.isSafeInteger(everyMs) || everyMs < 1)
    throw new TypeError('everyMs must be a positive whole number of ms');
  const now = options.now ?? Date.now;
  const schedule = options.schedule ?? unrefTimeout;
  const counts = new Map<string, number>();
  let last: ReportedError | undefined;
  let lastLineAt: number | undefined;
  let pending: { cancel(): void } | undefined;

  const writeLine = () => {
    pending?.cancel();
    pending = undefined;
    if (counts.size === 0 || last === undefined) return;
    let total = 0;
    const parts: string[] = [];
    for (const [code, count] of counts) {
      total += count;
      parts.push(`${code} ${count}`);
    }
    // A wrong client secret is the likeliest cause, and the operator's to fix: said when it is one.
    const hint = counts.has('invalid_client') ? "; is the app's client secret the provider's?" : '';
    const reason = `the last HTTP ${last.status ?? '?'}: ${last.message}`;
    counts.clear();
    last = undefined;
    lastLineAt = now();
    options.write(
      `third-party app: the provider refused ${total} ${total === 1 ? 'refresh' : 'refreshes'} (${parts.join(', ')}; ${reason}); the sessions keep their tokens${hint}`,
    );
  };

  return {
    note(error) {
      // The code was checked where it came from (a challenge's shape) or is the provider's JSON: only
      // a code's shape is written as it came.
      const code = typeof error.error === 'string' && /^[a-z_]{1,64}$/.test(error.error) ? error.error : 'other';
      counts.set(code, (counts.get(code) ?? 0) + 1);
      last = error;
      const since = lastLineAt === undefined ? Number.POSITIVE_INFINITY : now() - lastLineAt;
      if (since >= everyMs) writeLine();
      else pending ??= schedule(writeLine, everyMs - since);
    },
    flush: writeLine,
  };
}

function unrefTimeout(run: () => void, ms: number): { cancel(): void } {
  const timer = setTimeout(run, ms);
  timer.unref?.();
  return { cancel: () => clearTimeout(timer) };
}
