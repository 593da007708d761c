/**
 * A duration option given in seconds, checked once at construction: a finite number within
 * `[min, max]` (0 and unbounded by default), or a `TypeError` that names the option and its range.
 * Milliseconds are for the caller to derive, so every duration option of the guard is read alike.
 *
 * @example
 * const cooldownMs = seconds(options.cooldown ?? 30, 'jwks cooldown') * 1000;
 * seconds(options.replayTimeout ?? 1, 'dpop.replayTimeout', { min: 0.01, max: 60 });
 */
export function seconds(value: unknown, name: string, range: { min?: number; max?: number } = {}): number {
  const { min = 0, max = Number.POSITIVE_INFINITY } = range;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    const bound = max === Number.POSITIVE_INFINITY ? `at least ${min}` : `${min} to ${max}`;
    throw new TypeError(`${name} must be a number of seconds, ${bound}`);
  }
  return value;
}
