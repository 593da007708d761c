/** What {@link rejectionLogger} needs. */
export interface RejectionLoggerOptions {
  /** Where a line goes. */
  write: (line: string) => void;
  /** At most one line per this many ms (the first refusal goes out at once). Default 60,000. */
  everyMs?: number | undefined;
  /** Epoch ms. Default `Date.now`. */
  now?: (() => number) | undefined;
  /** Schedules the line of refusals that came in since the last one. Default `setTimeout`, unref'd. */
  schedule?: ((run: () => void, ms: number) => { cancel(): void }) | undefined;
}

/** A refused delivery, as the receiver's `rejected` event tells it. */
export interface RefusedDelivery {
  code?: string | undefined;
  error?: unknown;
}

/** The logger {@link rejectionLogger} makes. */
export interface RejectionLogger {
  /** Counts one refused delivery (and writes its line when one is due). */
  note(refused: RefusedDelivery): void;
  /** Writes the line of what was counted since the last one, if anything, and stops its timer. */
  flush(): void;
}

/**
 * Tells an operator about webhook deliveries the receiver refused: a wrong secret, a body a proxy
 * trimmed or re-encoded, a clock far off. Without it nothing on the receiver's side said so, and only
 * the sender's attempt history showed its 400s. Anyone can post junk to the endpoint, so refusals are
 * counted, not logged one by one: the first goes out at once, then at most one line per `everyMs`
 * with how many of each code came in since (the last of them written by a timer, so a burst that
 * stops is still told). A signature mismatch adds the length of the body that failed, which tells a
 * changed body (another length than the sender's) from a wrong secret; nothing of the request itself
 * (its bytes, headers or signatures) is written.
 *
 * @example
 * ```ts
 * const rejections = rejectionLogger({ write: (line) => process.stderr.write(`${line}\n`) });
 * createReceiver({ ..., onEvent: (event) => event.type === 'rejected' && rejections.note(event) });
 * // receiver: 1 webhook delivery refused (signature_mismatch 1; the last mismatch over a body of 1234 bytes)
 * ```
 */
export function rejectionLogger(options: RejectionLoggerOptions): RejectionLogger {
  const everyMs = options.everyMs ?? 60_000;
  if (!Number.isSafeInteger(everyMs) || everyMs < 1)
    throw new TypeError('everyMs must be a positive whole number of ms');
  const now = options.now ?? Date.now;
  const schedule = options.schedule ?? unrefTimeout;
  const counts = new Map<string, number>();
  let lastBodyBytes: number | undefined;
  let lastLineAt: number | undefined;
  let pending: { cancel(): void } | undefined;

  const writeLine = () => {
    pending?.cancel();
    pending = undefined;
    if (counts.size === 0) return;
    let total = 0;
    const parts: string[] = [];
    for (const [code, count] of counts) {
      total += count;
      parts.push(`${code} ${count}`);
    }
    const bytes = lastBodyBytes === undefined ? '' : `; the last mismatch over a body of ${lastBodyBytes} bytes`;
    counts.clear();
    lastBodyBytes = undefined;
    lastLineAt = now();
    options.write(
      `receiver: ${total} webhook ${total === 1 ? 'delivery' : 'deliveries'} refused (${parts.join(', ')}${bytes})`,
    );
  };

  return {
    note(refused) {
      // A code is one of the receiver's own; anything else is not written as it came.
      const code = typeof refused.code === 'string' && /^[a-z_]{1,64}$/.test(refused.code) ? refused.code : 'other';
      counts.set(code, (counts.get(code) ?? 0) + 1);
      const bodyBytes = (refused.error as { details?: { bodyBytes?: unknown } } | undefined)?.details?.bodyBytes;
      if (code === 'signature_mismatch' && Number.isSafeInteger(bodyBytes)) lastBodyBytes = bodyBytes as number;
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
