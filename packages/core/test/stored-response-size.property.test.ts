import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { StoredResponse } from '../src/store.js';
import { sizeOverLimit, storedResponseSize } from '../src/stored-response.js';

// sizeOverLimit skips the exact measure below an upper bound of it: the bound must never be under
// the exact size, whatever the characters (escapes take 6 bytes, a lone surrogate too, others 1 to 4).
const text = fc.oneof(
  fc.string({ unit: 'binary' }),
  fc.string({
    unit: fc.constantFrom('"', '\\', '\u0000', '\u001f', '\u007f', 'é', '€', '\ud800', '\udfff', '😀', 'a'),
  }),
);

const response = fc.record(
  {
    status: fc.integer({ min: 100, max: 599 }),
    headers: fc.dictionary(text, text, { maxKeys: 6 }),
    body: fc.uint8Array({ maxLength: 64 }),
    statusMessage: text,
  },
  { requiredKeys: ['status', 'headers', 'body'] },
) as fc.Arbitrary<StoredResponse>;

describe('sizeOverLimit', () => {
  it('is the exact size exactly when that is over the limit', () => {
    fc.assert(
      fc.property(response, fc.integer({ min: -8, max: 8 }), (stored, offset) => {
        const size = storedResponseSize(stored);
        // Limits right around the exact size, where a bound too small would answer wrong.
        for (const limit of [size + offset, size - 1, size, Math.max(1, Math.floor(size / 2))]) {
          expect(sizeOverLimit(stored, limit)).toBe(size > limit ? size : undefined);
        }
      }),
      { numRuns: 2_000 },
    );
  });

  it('measures exactly what JSON writes otherwise: a toJSON, values that are not strings', () => {
    const body = new Uint8Array(1);
    const withToJson = { status: 200, headers: { a: 'b', toJSON: () => ({ x: 'y'.repeat(100) }) }, body };
    const size = storedResponseSize(withToJson as unknown as StoredResponse);
    expect(size).toBeGreaterThan(100);
    expect(sizeOverLimit(withToJson as unknown as StoredResponse, size - 1)).toBe(size);
    const numeric = { status: 200, headers: { a: 12_345_678 }, body };
    const numericSize = storedResponseSize(numeric as unknown as StoredResponse);
    expect(sizeOverLimit(numeric as unknown as StoredResponse, numericSize - 1)).toBe(numericSize);
  });
});
