// A TLS handshake cut off before it was done sent nothing: Node says so only in its message (code
// ECONNRESET, like a reset after the request went out, which must stay an unknown outcome).
import { describe, expect, it } from 'vitest';
import { isNotConnected } from '../src/retry-decision.js';

const fetchFailed = (cause: object) => new TypeError('fetch failed', { cause });
const reset = (message: string) => Object.assign(new Error(message), { code: 'ECONNRESET' });

describe('isNotConnected and the TLS handshake', () => {
  it('an ECONNRESET before secure TLS connection was established: not connected', () => {
    expect(
      isNotConnected(
        fetchFailed(reset('Client network socket disconnected before secure TLS connection was established')),
      ),
    ).toBe(true);
  });

  it('any other ECONNRESET, or the words without its code: an unknown outcome', () => {
    expect(isNotConnected(fetchFailed(reset('read ECONNRESET')))).toBe(false);
    expect(
      isNotConnected(
        fetchFailed(
          Object.assign(new Error('before secure TLS connection was established'), { code: 'UND_ERR_SOCKET' }),
        ),
      ),
    ).toBe(false);
  });
});
