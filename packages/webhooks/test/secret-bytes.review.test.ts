// Review: a secret file read without an encoding (`readFileSync(path)`) is a Buffer of the secret's
// text. Taken as raw HMAC key bytes, it loaded, and every delivery failed as signature_mismatch.
import { describe, expect, it } from 'vitest';
import { createSigner, createVerifier, generateSecret, isWebhookError } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

const codeThrown = (fn: () => unknown) => {
  try {
    fn();
    return 'none';
  } catch (error) {
    return isWebhookError(error) ? error.code : String(error);
  }
};

describe('a secret given as the bytes of its text', () => {
  it.each([
    ['a whsec_ secret', SECRET],
    ['a whsec_ secret with the newline of its file', `${SECRET}\n`],
    ['a whsk_ key', (generateSecret('v1a') as { privateKey: string }).privateKey],
    ['a whpk_ key', (generateSecret('v1a') as { publicKey: string }).publicKey],
  ])('refuses %s with secret_invalid, naming the mistake', (_what, text) => {
    const bytes = new Uint8Array(Buffer.from(text, 'utf8'));
    expect(codeThrown(() => createVerifier({ secret: bytes }))).toBe('secret_invalid');
    expect(codeThrown(() => createVerifier({ secret: Buffer.from(text) }))).toBe('secret_invalid');
    expect(() => createVerifier({ secret: Buffer.from(text) })).toThrow(/text/);
    if (!text.startsWith('whpk_'))
      expect(codeThrown(() => createSigner({ secret: Buffer.from(text) }))).toBe('secret_invalid');
  });

  it('still takes raw key bytes, and the string form of the same key verifies what they sign', () => {
    const raw = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
    const headers = createSigner({ secret: raw }).sign({ id: 'evt_1', body: '{}', timestamp: 1_700_000_000 });
    const verifier = createVerifier({ secret: SECRET, now: () => 1_700_000_000_000 });
    expect(verifier.verify({ headers, body: '{}' }).ok).toBe(true);
  });
});
