import { describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

// A `sub` keys the idempotency scope and the audit lines, and the guard refuses one holding a line
// break for that (claims.ts, attack case 37). U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR
// are line breaks too (Unicode's mandatory breaks): Python's str.splitlines(), editors and many log
// viewers end a line at them, and JSON.stringify leaves them as they are. Inside a subject they
// passed ('user\u2028x'), as they are neither control characters (Cc) nor bidirectional controls.
describe('a sub holding a Unicode line or paragraph separator', () => {
  it('is claim_invalid, as one holding \\n is', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    for (const sub of ['user\u2028admin', 'user\u2029admin', 'a\u2028', '\u2029a']) {
      const result = await guard.verify(makeToken({ claims: { sub } }));
      expect(result.ok ? 'ok' : result.error.code, JSON.stringify(sub)).toBe('claim_invalid');
    }
  });

  // Was wrong: blank to the eye but no whitespace to trim(): a sub of only a zero width space, a
  // Hangul filler or the blank braille pattern passed, one shared invisible "nobody".
  it('is claim_invalid when it holds no visible character, whitespace or not', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    for (const sub of [
      '\u200b',
      '\u200b\u200b',
      '\u3164',
      '\u115f',
      '\u1160',
      '\uffa0',
      '\u2800',
      '\u200d',
      ' \u200b ',
      '\u2060',
    ]) {
      const result = await guard.verify(makeToken({ claims: { sub } }));
      expect(result.ok ? 'ok' : result.error.code, JSON.stringify(sub)).toBe('claim_invalid');
    }
    for (const sub of ['a\u200bb', '\u200bx', 'ü\u200db', '\u3164a', '0']) {
      const result = await guard.verify(makeToken({ claims: { sub } }));
      expect(result.ok ? 'ok' : result.error.code, JSON.stringify(sub)).toBe('ok');
    }
  });
});
