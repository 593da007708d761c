// Case 20: the v1 signature check compares through crypto.timingSafeEqual, on equal-length bytes.
// A spy on the real function proves the comparison goes through it; an `===`, a Buffer#equals or
// a loop that stops at the first differing byte would leave the spy uncalled and fail these tests.
import crypto from 'node:crypto';
import { syncBuiltinESMExports } from 'node:module';
import { afterEach, beforeEach, describe, expect, it, type MockInstance, vi } from 'vitest';
import { createVerifier, parseSecret, sign } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const content = Buffer.from(`${ID}.${TS}.${BODY}`);
const expected = crypto.createHmac('sha256', KEY).update(content).digest();

let spy: MockInstance<typeof crypto.timingSafeEqual>;
beforeEach(() => {
  spy = vi.spyOn(crypto, 'timingSafeEqual');
  // The source imports the named export; this makes the ESM binding of node:crypto follow the spy.
  syncBuiltinESMExports();
});
afterEach(() => {
  spy.mockRestore();
  syncBuiltinESMExports();
});

describe('constant-time comparison (case 20)', () => {
  it('compares a v1 signature with timingSafeEqual, on the expected HMAC and the decoded bytes of equal length', () => {
    const key = parseSecret(SECRET);
    expect(key.verify(content, Buffer.from(expected))).toBe(true);
    expect(spy).toHaveBeenCalledTimes(1);
    const [a, b] = spy.mock.calls[0] as [Buffer, Buffer];
    expect(a.length).toBe(32);
    expect(b.length).toBe(32);
    expect(Buffer.from(a).equals(expected)).toBe(true);
  });

  it('answers from timingSafeEqual: a spy that says "equal" makes any same-length signature pass', () => {
    // If the answer came from anywhere else (===, Buffer#equals), forcing timingSafeEqual would change nothing.
    const key = parseSecret(SECRET);
    const wrong = Buffer.alloc(32, 7);
    expect(key.verify(content, wrong)).toBe(false);
    spy.mockReturnValue(true);
    expect(key.verify(content, wrong)).toBe(true);
  });

  it('goes through timingSafeEqual on the whole verify path, for the match and the mismatch', () => {
    const verifier = createVerifier({ secret: SECRET, now: () => TS * 1000 });
    const headers = sign({ secret: SECRET, id: ID, body: BODY, timestamp: TS });
    expect(verifier.verify({ headers, body: BODY }).ok).toBe(true);
    expect(spy).toHaveBeenCalledTimes(1);
    const tampered = verifier.verify({ headers, body: `${BODY} ` });
    expect(tampered.ok).toBe(false);
    expect(spy).toHaveBeenCalledTimes(2);
    expect(spy.mock.results[1]).toEqual({ type: 'return', value: false });
  });

  it('returns false for a signature of another length without calling timingSafeEqual (which would throw)', () => {
    const key = parseSecret(SECRET);
    expect(key.verify(content, expected.subarray(0, 31))).toBe(false);
    expect(key.verify(content, Buffer.concat([expected, Buffer.alloc(1)]))).toBe(false);
    expect(key.verify(content, Buffer.alloc(0))).toBe(false);
    expect(spy).not.toHaveBeenCalled();
  });
});

describe('the cost of a hostile header', () => {
  it('computes one HMAC per key per delivery, however many v1 entries the header carries', () => {
    // Before, each of up to 32 entries recomputed the HMAC of the whole body for each key: an
    // unauthenticated request (only a current timestamp needed) cost 32 times one verification.
    const hmac = vi.spyOn(crypto, 'createHmac');
    syncBuiltinESMExports();
    try {
      const secrets = [
        SECRET,
        `whsec_${Buffer.alloc(24, 1).toString('base64')}`,
        `whsec_${Buffer.alloc(24, 2).toString('base64')}`,
      ];
      const verifier = createVerifier({ secret: secrets, now: () => TS * 1000 });
      const bogus = Array.from({ length: 32 }, (_, i) => `v1,${Buffer.alloc(32, i).toString('base64')}`).join(' ');
      const headers = { 'webhook-id': ID, 'webhook-timestamp': String(TS), 'webhook-signature': bogus };
      hmac.mockClear();
      expect(verifier.verify({ headers, body: BODY }).ok).toBe(false);
      expect(hmac).toHaveBeenCalledTimes(secrets.length);
    } finally {
      hmac.mockRestore();
      syncBuiltinESMExports();
    }
  });
});
