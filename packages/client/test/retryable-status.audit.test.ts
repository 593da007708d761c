// The status rule's edges, found untested by a mutation pass: a 501 or a 525 made retryable, or
// 425 dropped, changed no test (each named in its comment).
import { describe, expect, it } from 'vitest';
import { isRetryableStatus } from '../src/index.js';

const read = { method: 'GET', keyed: false };
const keyedWrite = { method: 'POST', keyed: true };

describe('isRetryableStatus edges (mutants)', () => {
  // Kills: 501 taken with 500, 502, 503, 504. "Not implemented" says the server must change first.
  it('never retries the 5xx that say the request or the server must change first', () => {
    for (const status of [501, 505, 506, 507, 508, 510, 511]) {
      expect(isRetryableStatus(status, read), String(status)).toBe(false);
      expect(isRetryableStatus(status, keyedWrite), String(status)).toBe(false);
    }
  });

  // Kills: the CDN range read as 520 to 525. 525 and 526 are Cloudflare's TLS handshake and
  // certificate failures between it and the origin: every retry meets them again. 519 is no name.
  it("retries a CDN's 520 to 524 and nothing either side of them", () => {
    for (const status of [520, 521, 522, 523, 524]) expect(isRetryableStatus(status, read), String(status)).toBe(true);
    for (const status of [519, 525, 526, 527, 530]) {
      expect(isRetryableStatus(status, read), String(status)).toBe(false);
      expect(isRetryableStatus(status, keyedWrite), String(status)).toBe(false);
    }
  });
});
