import { maxTimerMs } from '@idem/client';

/** How often expired rows are deleted when no interval is given: ten minutes. */
export const defaultPurgeEveryMs = 600_000;

// `maxTimerMs` is the longest delay a Node timer keeps. Past it (or at 0, a negative or a non-number)
// `setInterval` fires every millisecond instead, with only a warning: a purge of the whole table a
// thousand times a second, which is the opposite of what a long interval meant.

/**
 * The purge interval `value` (milliseconds), or the default when it is undefined. Anything but a whole
 * number from 1 to 2147483647 is a `TypeError` naming `name`, thrown before anything starts.
 *
 * @example
 * const every = purgeEvery(options.purgeEveryMs, 'purgeEveryMs');
 */
export function purgeEvery(value: number | undefined, name: string): number {
  if (value === undefined) return defaultPurgeEveryMs;
  if (!Number.isInteger(value) || value < 1 || value > maxTimerMs) {
    throw new TypeError(`${name} must be a whole number of milliseconds from 1 to ${maxTimerMs}, not ${String(value)}`);
  }
  return value;
}
