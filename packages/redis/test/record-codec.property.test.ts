import { storedResponseSize } from '@idem/core';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeRecord, encodeClaim, encodeOutcome, leasePrefix } from '../src/record-codec.js';

// What the completion script does in Lua: 'p' becomes 'c' and the outcome is appended.
const complete = (claim: Buffer, outcome: Buffer) => Buffer.concat([Buffer.from('c'), claim.subarray(1), outcome]);

const startsWith = (value: Buffer, prefix: Buffer) =>
  value.length >= prefix.length && value.subarray(0, prefix.length).equals(prefix);

describe('record codec properties', () => {
  it('round-trips any token, fingerprint, status, headers and body byte for byte', () => {
    fc.assert(
      fc.property(
        fc.string({ unit: 'binary' }),
        fc.string({ unit: 'binary' }),
        fc.integer({ min: 100, max: 599 }),
        fc.dictionary(fc.string(), fc.string({ unit: 'binary' })),
        fc.uint8Array({ maxLength: 2_048 }),
        (token, fingerprint, status, headers, body) => {
          const claim = encodeClaim(token, fingerprint);
          expect(decodeRecord(claim)).toEqual({ state: 'in_progress', token, fingerprint });
          const outcome = encodeOutcome({ status, headers, body });
          // The size every store checks against maxResponseBytes is what Redis keeps, exactly.
          expect(outcome.length).toBe(storedResponseSize({ status, headers, body }));
          const record = decodeRecord(complete(claim, outcome));
          expect(record.state).toBe('completed');
          if (record.state !== 'completed') return;
          expect(record.token).toBe(token);
          expect(record.fingerprint).toBe(fingerprint);
          expect(record.response.status).toBe(status);
          expect(record.response.headers).toEqual(headers);
          expect(Buffer.from(record.response.body).equals(Buffer.from(body))).toBe(true);
        },
      ),
    );
  });

  it('fences exactly: a lease prefix matches the claim of the same token and nothing else', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), fc.string({ unit: 'binary' }), fc.string(), (a, b, fingerprint) => {
        const claim = encodeClaim(a, fingerprint);
        expect(startsWith(claim, leasePrefix(a))).toBe(true);
        expect(startsWith(claim, leasePrefix(b))).toBe(a === b);
        // A completed record never matches any lease prefix: complete, renew and release refuse it.
        const done = complete(claim, encodeOutcome({ status: 200, headers: {}, body: new Uint8Array() }));
        expect(startsWith(done, leasePrefix(a))).toBe(false);
      }),
    );
  });
});
