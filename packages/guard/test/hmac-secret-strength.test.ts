import { describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock } from './support/tokens.js';

// RFC 7518 §3.2: "A key of the same size as the hash output (for instance, 256 bits for HS256) or
// larger MUST be used". A string secret is used as its UTF-8 bytes, so its bytes are what count.

const minimum = { HS256: 32, HS384: 48, HS512: 64 } as const;
type Hs = keyof typeof minimum;

// Secrets of an exact byte length whose bytes differ from each other, so only the length is at stake.
const text = (bytes: number) =>
  '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/'.repeat(2).slice(0, bytes);
const binary = (bytes: number) => Uint8Array.from({ length: bytes }, (_, index) => index + 1);

function guardWith(secret: string | Uint8Array, alg: Hs = 'HS256') {
  return createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, algorithms: [alg], secret }],
  });
}

describe('HMAC secret length (RFC 7518 §3.2)', () => {
  for (const [alg, bytes] of Object.entries(minimum) as Array<[Hs, number]>) {
    it(`${alg}: ${bytes - 1} bytes are a TypeError naming the minimum and the algorithm; ${bytes} bytes verify`, async () => {
      for (const short of [text(bytes - 1), binary(bytes - 1)]) {
        expect(() => guardWith(short, alg)).toThrow(TypeError);
        expect(() => guardWith(short, alg)).toThrow(
          `issuer ${ISSUER}: a ${alg} secret must be at least ${bytes} bytes (RFC 7518 §3.2); this one is ${bytes - 1}`,
        );
      }
      for (const enough of [text(bytes), binary(bytes)]) {
        const guard = guardWith(enough, alg);
        const result = await guard.verify(makeToken({ alg, key: enough }));
        expect(result.ok ? 'ok' : result.error.code).toBe('ok');
      }
    });
  }

  it('a string counts its UTF-8 bytes, not its characters', () => {
    // 16 characters, 32 bytes: enough for HS256.
    expect(() => guardWith('é'.repeat(15) + 'ü')).not.toThrow();
    // 31 characters, 32 bytes: enough as well.
    expect(() => guardWith(`é${text(30)}`)).not.toThrow();
    // 16 characters of 31 bytes are not.
    expect(() => guardWith(`${'é'.repeat(15)}a`)).toThrow(/at least 32 bytes .*this one is 31/);
    // HS512: 32 two-byte characters are 64 bytes.
    expect(() => guardWith('é'.repeat(16) + 'ü'.repeat(16), 'HS512')).not.toThrow();
  });

  it('the message never holds the secret', () => {
    const secret = 'short-and-secret';
    let message = '';
    try {
      guardWith(secret);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toMatch(/at least 32 bytes/);
    expect(message).not.toContain(secret);
  });
});

describe('HMAC secret: one byte repeated', () => {
  // A secret whose bytes are all the same carries at most 8 bits, whatever its length: a placeholder
  // ('x'.repeat(32)) or an unfilled buffer (new Uint8Array(32)), never a generated secret.
  it('is a TypeError for text and for bytes, at every algorithm, and names no byte of it', () => {
    const cases: Array<[string | Uint8Array, Hs]> = [
      ['x'.repeat(32), 'HS256'],
      ['\u0000'.repeat(48), 'HS384'],
      [new Uint8Array(32), 'HS256'],
      [new Uint8Array(64).fill(0xff), 'HS512'],
    ];
    for (const [secret, alg] of cases) {
      expect(() => guardWith(secret, alg)).toThrow(TypeError);
      expect(() => guardWith(secret, alg)).toThrow(`issuer ${ISSUER}: the secret is one byte repeated`);
    }
  });

  it('two different bytes are enough to pass this rule (length rules it out otherwise)', () => {
    expect(() => guardWith(`${'x'.repeat(31)}y`)).not.toThrow();
    const bytes = new Uint8Array(32);
    bytes[31] = 1;
    expect(() => guardWith(bytes)).not.toThrow();
  });
});
