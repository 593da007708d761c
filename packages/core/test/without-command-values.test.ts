// Driver errors carry the values of the command that failed; a store's error must not (they are the
// stored responses, bodies included, and the error goes on to store-error events and logs).
import { describe, expect, it } from 'vitest';
import { StoreUnavailableError, withoutCommandValues } from '../src/index.js';

describe('withoutCommandValues', () => {
  it("keeps ioredis's command name and drops its arguments", () => {
    const error = Object.assign(new Error('READONLY'), { command: { name: 'evalsha', args: ['sha', 'body 4111'] } });
    expect(withoutCommandValues(error)).toBe(error);
    expect(error.command).toEqual({ name: 'evalsha' });
  });

  it("drops PGlite's bound values and keeps the statement", () => {
    const error = Object.assign(new Error('read-only'), { query: 'UPDATE t SET body = $1', params: ['body 4111'] });
    withoutCommandValues(error);
    expect(error).not.toHaveProperty('params');
    expect(error.query).toBe('UPDATE t SET body = $1');
  });

  it('passes other values, and errors it cannot change, through as they are', () => {
    expect(withoutCommandValues('text')).toBe('text');
    expect(withoutCommandValues(undefined)).toBeUndefined();
    const frozen = Object.freeze(Object.assign(new Error('x'), { params: ['kept'] }));
    expect(withoutCommandValues(frozen)).toBe(frozen);
  });

  it('is applied to the cause of every StoreUnavailableError', () => {
    const cause = Object.assign(new Error('OOM'), { command: { name: 'set', args: ['k', 'secret'] } });
    const error = new StoreUnavailableError('Redis claim failed', { cause });
    expect(error.cause).toBe(cause);
    expect(cause.command).toEqual({ name: 'set' });
  });
});
