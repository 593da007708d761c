import { parseHttpDate, parseRetryAfter, retryAfterOf } from '@idem/client';
import { describe, expect, it } from 'vitest';

const now = Date.UTC(2026, 10, 21, 6, 0, 0);

describe('parseRetryAfter', () => {
  it('reads delay-seconds', () => {
    expect(parseRetryAfter('3', now)).toBe(3000);
    expect(parseRetryAfter(' 0 ', now)).toBe(0);
    expect(parseRetryAfter('120', now)).toBe(120_000);
  });

  it('reads the three HTTP-date forms as a wait from now', () => {
    expect(parseRetryAfter('Sat, 21 Nov 2026 06:00:05 GMT', now)).toBe(5000);
    expect(parseRetryAfter('Saturday, 21-Nov-26 06:00:07 GMT', now)).toBe(7000);
    expect(parseRetryAfter('Sat Nov 21 06:00:09 2026', now)).toBe(9000);
    expect(parseRetryAfter('Sat Nov  1 06:00:00 2026', Date.UTC(2026, 10, 1, 5, 59, 59))).toBe(1000);
  });

  it('reads the header sent twice with the same value (fetch joins the copies with ", ")', () => {
    expect(parseRetryAfter('5, 5', now)).toBe(5000);
    expect(parseRetryAfter('5,5,5', now)).toBe(5000);
    const date = 'Sat, 21 Nov 2026 06:00:05 GMT';
    expect(parseRetryAfter(`${date}, ${date}`, now)).toBe(5000);
    expect(parseRetryAfter(`${date}, ${date}, ${date}`, now)).toBe(5000);
    const headers = new Headers();
    headers.append('retry-after', '7');
    headers.append('retry-after', '7');
    expect(retryAfterOf(headers, now)).toBe(7000);
  });

  it('ignores copies that differ: which one the server meant is unknown', () => {
    for (const value of [
      '5, 6',
      '5, 5, 6',
      'Sat, 21 Nov 2026 06:00:05 GMT, Sat, 21 Nov 2026 06:00:06 GMT',
      '5, ',
      ', 5',
    ]) {
      expect(parseRetryAfter(value, now), value).toBeUndefined();
    }
  });

  it('gives 0 for a date in the past', () => {
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', now)).toBe(0);
  });

  it('ignores anything else', () => {
    for (const value of [
      null,
      undefined,
      '',
      '-1',
      '1.5',
      'soon',
      '2026-11-21T06:00:05Z',
      'Sat, 21 Nov 2026 06:00:05 PST',
      'Sat Nov 21 06:00:05 2026 PST',
    ]) {
      expect(parseRetryAfter(value, now)).toBeUndefined();
    }
  });

  it('parses IMF-fixdate exactly and places two-digit years', () => {
    expect(parseHttpDate('Sun, 06 Nov 1994 08:49:37 GMT')).toBe(784111777000);
    expect(parseHttpDate('Sunday, 06-Nov-94 08:49:37 GMT', now)).toBe(784111777000);
    expect(parseHttpDate('Sun, 06 Foo 1994 08:49:37 GMT')).toBeUndefined();
  });

  // Was a defect: Date.UTC rolled impossible fields over, so 31 Feb read as 3 Mar and 99:99:99 as
  // four days later, and the client waited for a moment the server never named.
  it('refuses a date that names no moment, and keeps a leap second', () => {
    for (const text of [
      'Tue, 31 Feb 2026 08:00:00 GMT',
      'Wed, 29 Feb 2025 08:00:00 GMT',
      'Sat, 21 Nov 2026 24:00:00 GMT',
      'Sat, 21 Nov 2026 99:99:99 GMT',
      'Sat, 21 Nov 2026 07:60:00 GMT',
      'Sat, 21 Nov 2026 07:00:61 GMT',
      'Sat, 00 Nov 2026 07:00:00 GMT',
      'Tuesday, 31-Apr-26 07:00:00 GMT',
    ]) {
      expect(parseHttpDate(text, now), text).toBeUndefined();
    }
    expect(parseHttpDate('Thu, 29 Feb 2024 08:00:00 GMT')).toBe(Date.UTC(2024, 1, 29, 8));
    expect(parseHttpDate('Wed, 31 Dec 2025 23:59:60 GMT')).toBe(Date.UTC(2026, 0, 1));
  });
});

describe('two-digit years (RFC 9110 5.6.7)', () => {
  it('places them in this century unless that is more than 50 years ahead', () => {
    // Retry-After across a new year: the next year is not a century ago.
    expect(parseRetryAfter('Friday, 01-Jan-27 00:00:03 GMT', Date.UTC(2026, 11, 31, 23, 59, 58))).toBe(5000);
    expect(parseHttpDate('Wednesday, 01-Jan-76 00:00:00 GMT', now)).toBe(Date.UTC(2076, 0, 1));
    expect(parseHttpDate('Friday, 01-Jan-77 00:00:00 GMT', now)).toBe(Date.UTC(1977, 0, 1));
  });
});

describe('retryAfterOf', () => {
  it("measures an HTTP-date from the response's own Date, whatever the local clock says", () => {
    const headers = new Headers({
      date: 'Sat, 21 Nov 2026 07:00:00 GMT',
      'retry-after': 'Sat, 21 Nov 2026 07:00:05 GMT',
    });
    // The local clock is an hour behind the server's: the server still means five seconds.
    expect(retryAfterOf(headers, now)).toBe(5000);
    expect(retryAfterOf(headers, now + 2 * 3_600_000)).toBe(5000);
  });

  it('falls back to the local clock without a valid Date, and reads delay-seconds as they are', () => {
    expect(retryAfterOf(new Headers({ 'retry-after': 'Sat, 21 Nov 2026 06:00:05 GMT' }), now)).toBe(5000);
    expect(retryAfterOf(new Headers({ date: 'yesterday', 'retry-after': 'Sat, 21 Nov 2026 06:00:05 GMT' }), now)).toBe(
      5000,
    );
    expect(retryAfterOf(new Headers({ date: 'Sat, 21 Nov 2026 09:00:00 GMT', 'retry-after': '7' }), now)).toBe(7000);
    expect(retryAfterOf(new Headers(), now)).toBeUndefined();
  });
});
