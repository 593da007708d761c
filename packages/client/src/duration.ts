/**
 * A duration in milliseconds, or a string such as `'500ms'`, `'10s'`, `'2m'`, `'1h'`: the same
 * spelling the server side (`createIdempotency({ retention: '24h' })`) uses, so one config reads alike.
 *
 * @example
 * const timeout: Duration = '10s';
 */
export type Duration = number | `${number}${'ms' | 's' | 'm' | 'h' | 'd'}`;

const units: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Converts a {@link Duration} to milliseconds, throwing a `TypeError` that names the option on
 * anything else, so a typo fails when the client is built rather than on the first retry.
 *
 * @example
 * durationToMs('2s', 'baseDelay'); // 2000
 */
export function durationToMs(value: Duration, name: string): number {
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0) {
      throw new TypeError(`${name} must be a finite, non-negative number of milliseconds`);
    }
    return value;
  }
  const match = typeof value === 'string' ? /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(value.trim()) : null;
  if (!match) throw new TypeError(`${name} must be milliseconds or a string like '500ms', '10s' or '1m'`);
  return Number(match[1]) * (units[match[2] as string] as number);
}
