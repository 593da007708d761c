// Audit of Retry-After sent twice (onlyValue): hostile values, their cost, the response's Date sent
// twice, and the webhooks sender reading the header through the same parser from a real server.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseRetryAfter, retryAfterOf } from '@idem/client';
import { createSender } from '@idem/webhooks';
import { describe, expect, it } from 'vitest';

const now = Date.UTC(2026, 10, 21, 6, 0, 0);

describe('Retry-After sent more than once', () => {
  // Was wrong: four copies (or six, eight, nine, any count with a factor from 2 to 8 that is not
  // itself the count) were split into two copies of "5, 5", which is no value, so `5, 5, 5, 5`
  // gave no wait, where `5, 5, 5` and 11 copies gave 5 s. Every count of the same value is now that value.
  it('reads any number of copies of one value as that value', () => {
    const date = 'Sat, 21 Nov 2026 06:00:05 GMT';
    for (let copies = 1; copies <= 40; copies++) {
      expect(parseRetryAfter(Array(copies).fill('5').join(', '), now), `${copies} copies`).toBe(5000);
      expect(parseRetryAfter(Array(copies).fill('5').join(','), now), `${copies} copies`).toBe(5000);
      expect(parseRetryAfter(Array(copies).fill(date).join(', '), now), `${copies} dates`).toBe(5000);
    }
  });

  it('reads hostile values quickly and as nothing unless every copy is the same', () => {
    const started = performance.now();
    // A header near undici's 16 KiB limit, and far past it, in every shape the parser splits.
    expect(parseRetryAfter(`${'1, '.repeat(5_000)}1`, now)).toBe(1000);
    expect(parseRetryAfter(`${'1, '.repeat(5_000)}2`, now)).toBeUndefined();
    expect(parseRetryAfter(','.repeat(200_000), now)).toBeUndefined();
    expect(parseRetryAfter(`${'9'.repeat(100_000)}, ${'9'.repeat(100_000)}`, now)).toBe(
      Number('9'.repeat(100_000)) * 1000,
    );
    expect(parseRetryAfter('a'.repeat(1_000_000), now)).toBeUndefined();
    expect(parseRetryAfter(`${'Sat, 21 Nov 2026 06:00:05 GMT, '.repeat(2_000)}x`, now)).toBeUndefined();
    // Copies that differ, an empty copy, a sign or a fraction say nothing: the backoff decides.
    for (const value of ['5, 6', '5, ', ', 5', '5,,5', '-5, -5', '1.5, 1.5', '5, 5x']) {
      expect(parseRetryAfter(value, now), value).toBeUndefined();
    }
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  // Was wrong: a Retry-After date is measured from the response's own Date so that a client whose
  // clock is off still waits what the server meant. A Date sent twice (a proxy adding its own beside
  // the origin's), the same value both times, reached Headers as "d, d", was no date, and the wait
  // was measured from the client's clock instead: here an hour off, so no wait at all. The same
  // value sent twice is now that value for Date too, as it is for Retry-After.
  it("measures a date from the response's Date even when that Date was sent twice with one value", () => {
    const serverDate = 'Sat, 21 Nov 2026 06:00:00 GMT';
    const headers = new Headers();
    headers.append('retry-after', 'Sat, 21 Nov 2026 06:00:30 GMT');
    headers.append('date', serverDate);
    headers.append('date', serverDate);
    const clientAnHourAhead = now + 3_600_000;
    expect(retryAfterOf(headers, clientAnHourAhead)).toBe(30_000);
    // Two different Dates: which one the server meant is unknown, and the client's clock measures.
    const disagreeing = new Headers(headers);
    disagreeing.delete('date');
    disagreeing.append('date', serverDate);
    disagreeing.append('date', 'Sat, 21 Nov 2026 05:59:00 GMT');
    expect(retryAfterOf(disagreeing, now)).toBe(30_000);
    expect(retryAfterOf(disagreeing, clientAnHourAhead)).toBe(0);
  });

  it('the webhooks sender reads a Retry-After its receiver sent twice', async () => {
    const server = createServer((request, response) => {
      request.resume();
      request.on('end', () => {
        response.setHeader('retry-after', ['120', '120']);
        response.writeHead(503);
        response.end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const sender = createSender({ secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', timeout: '5s' });
      const attempt = await sender.attempt(
        { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`, id: 'evt_1', body: '{}' },
        1,
      );
      expect([attempt.status, attempt.retryAfterMs]).toEqual([503, 120_000]);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
