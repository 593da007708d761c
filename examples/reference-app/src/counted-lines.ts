/** What {@link countedLines} needs. */
export interface CountedLinesOptions {
  /** Where a line goes. */
  write: (line: string) => void;
  /** At most one line per this many ms (the first one goes out at once). Default 60,000. */
  everyMs?: number | undefined;
  /** Epoch ms. Default `Date.now`. */
  now?: (() => number) | undefined;
  /** Schedules the line of what came in since the last one. Default `setTimeout`, unref'd. */
  schedule?: ((run: () => void, ms: number) => { cancel(): void }) | undefined;
}

/** What a line is made of: how many came in since the last line, and `code count` for each code. */
export interface Counted {
  total: number;
  /** `signature_mismatch 3, timestamp_out_of_range 1`, in the order the codes first came. */
  parts: string;
}

/** The counter {@link countedLines} makes. */
export interface CountedLines {
  /**
   * Counts one under `code` (a code of another shape than `a_code_like_this` counts as `other`, so
   * nothing that came from outside is written as it came), and writes the line when one is due.
   */
  count(code: unknown): void;
  /** Writes the line of what was counted since the last one, if anything, and stops its timer. */
  flush(): void;
}

/**
 * Counted lines for an operator, of refusals that may come in floods (junk posted to the webhook
 * endpoint, a client secret the provider no longer takes): the first goes out at once, then at most
 * one line per `everyMs` with how many of each code came in since, the last of them written by a
 * timer, so a burst that stops is still told. `line` words it, and may add what its caller kept of
 * the last one (it is called when the line is written, and only then).
 *
 * @example
 * ```ts
 * const lines = countedLines({ write: console.warn }, ({ total, parts }) => `${total} refused (${parts})`);
 * lines.count('signature_mismatch'); // "1 refused (signature_mismatch 1)" at once
 * ```
 */
export function countedLines(options: CountedLinesOptions, line: (counted: Counted) => string): CountedLines {
  const everyMs = options.everyMs ?? 60_000;
  if (!Number.isSafeInteger(everyMs) || everyMs < 1)
    throw new TypeError('everyMs must be a positive whole number of ms');
  const now = options.now ?? Date.now;
  const schedule = options.schedule ?? unrefTimeout;
  const counts = new Map<string, number>();
  let lastLineAt: number | undefined;
  let pending: { cancel(): void } | undefined;

  const flush = () => {
    pending?.cancel();
    pending = undefined;
    if (counts.size === 0) return;
    let total = 0;
    const parts: string[] = [];
    for (const [code, count] of counts) {
      total += count;
      parts.push(`${code} ${count}`);
    }
    counts.clear();
    lastLineAt = now();
    options.write(line({ total, parts: parts.join(', ') }));
  };

  return {
    count(code) {
      const shaped = typeof code === 'string' && /^[a-z_]{1,64}$/.test(code) ? code : 'other';
      counts.set(shaped, (counts.get(shaped) ?? 0) + 1);
      const since = lastLineAt === undefined ? Number.POSITIVE_INFINITY : now() - lastLineAt;
      if (since >= everyMs) flush();
      else pending ??= schedule(flush, everyMs - since);
    },
    flush,
  };
}

function unrefTimeout(run: () => void, ms: number): { cancel(): void } {
  const timer = setTimeout(run, ms);
  timer.unref?.();
  return { cancel: () => clearTimeout(timer) };
}
