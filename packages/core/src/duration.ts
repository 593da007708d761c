/**
 * A duration in milliseconds, or a string such as `'500ms'`, `'10s'`, `'15m'`, `'24h'`, `'7d'`.
 *
 * @example
 * const retention: Duration = '24h';
 */
export type Duration = number | `${number}${'ms' | 's' | 'm' | 'h' | 'd'}`;

const units: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Converts a {@link Duration} to milliseconds. Throws a `TypeError` on anything that is not a
 * finite, non-negative duration, so a typo in an option fails at construction, not at 3 a.m.
 *
 * @example
 * toMilliseconds('10s'); // 10000
 */
export function toMilliseconds(value: Duration, name = 'duration'): number {
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0)
      throw new TypeError(`${name} must be a finite, non-negative number of milliseconds`);
    return value;
  }
  const match = typeof value === 'string' ? /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(value.trim()) : null;
  if (!match) throw new TypeError(`${name} must be milliseconds or a string like '10s' or '24h'`);
  return Number(match[1]) * (units[match[2] as string] as number);
}
