import { type CountedLinesOptions, countedLines } from '../counted-lines.js';

/** What {@link rejectionLogger} needs. */
export type RejectionLoggerOptions = CountedLinesOptions;

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
  let lastBodyBytes: number | undefined;
  const lines = countedLines(options, ({ total, parts }) => {
    const bytes = lastBodyBytes === undefined ? '' : `; the last mismatch over a body of ${lastBodyBytes} bytes`;
    lastBodyBytes = undefined;
    return `receiver: ${total} webhook ${total === 1 ? 'delivery' : 'deliveries'} refused (${parts}${bytes})`;
  });
  return {
    note(refused) {
      // Kept before the count, which may write the line at once.
      const bodyBytes = (refused.error as { details?: { bodyBytes?: unknown } } | undefined)?.details?.bodyBytes;
      if (refused.code === 'signature_mismatch' && Number.isSafeInteger(bodyBytes)) lastBodyBytes = bodyBytes as number;
      lines.count(refused.code);
    },
    flush: lines.flush,
  };
}
