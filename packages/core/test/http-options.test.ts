import { describe, expect, it } from 'vitest';
import { createHttpIdempotency } from '../src/http.js';
import { memoryStore } from '../src/memory-store.js';

describe('createHttpIdempotency options', () => {
  it('refuses a conflictRetryAfter or unavailableRetryAfter that is no delay-seconds, naming the option', () => {
    for (const name of ['conflictRetryAfter', 'unavailableRetryAfter'] as const) {
      for (const bad of ['1s', '1', 1.5, -1, Number.NaN, Number.POSITIVE_INFINITY, 1e21, null]) {
        expect(() => createHttpIdempotency({ store: memoryStore(), [name]: bad as never }), `${name}: ${bad}`).toThrow(
          new TypeError(`${name} must be a whole number of seconds, at least 0 (it is sent as Retry-After)`),
        );
      }
    }
  });

  it('puts a good one on the wire as it is: 0 is a valid delay', async () => {
    for (const seconds of [0, 5]) {
      const http = createHttpIdempotency({ store: memoryStore(), conflictRetryAfter: seconds });
      const request = {
        method: 'POST',
        route: '/charges',
        path: '/charges',
        query: '',
        contentType: undefined,
        keyHeader: 'k-1',
        body: undefined,
        scope: 'caller',
      };
      expect((await http.begin(request)).kind).toBe('execute');
      const second = await http.begin(request);
      expect(second.kind === 'respond' && second.response.headers['retry-after']).toBe(String(seconds));
    }
  });

  it('refuses an advertiseExpiry that is not a boolean', () => {
    for (const bad of ['yes', 1, {}]) {
      expect(() => createHttpIdempotency({ store: memoryStore(), advertiseExpiry: bad as never }), String(bad)).toThrow(
        new TypeError('advertiseExpiry must be a boolean'),
      );
    }
  });
});
