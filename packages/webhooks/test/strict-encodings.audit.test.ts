// Written by a mutation-testing pass: each test kills a mutant of a parsing rule that every other
// webhook test let live (named in its comment). The rules are documented (docs/webhooks.md: "bad
// base64", "a timestamp that is not digits only", "a malformed v1 or v1a entry"); nothing held them.
import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createVerifier, isWebhookError, parseSecret } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const signature = createHmac('sha256', KEY).update(`${ID}.${TS}.${BODY}`).digest('base64');

const codeThrown = (run: () => unknown): string => {
  try {
    run();
  } catch (error) {
    return isWebhookError(error) ? error.code : 'other';
  }
  return 'none';
};

describe('strict encodings (mutants)', () => {
  // Kills: decodeBase64 without its `length % 4 === 1` check. One character past a whole number of
  // quads holds 6 bits, never a byte; Buffer.from drops it without a word, so a secret pasted with a
  // stray character appended loaded as if the character were not there.
  it('refuses a secret whose base64 has one character too many for whole bytes', () => {
    const body = Buffer.alloc(24, 7).toString('base64');
    expect(codeThrown(() => parseSecret(`whsec_${body}`))).toBe('none');
    expect(codeThrown(() => parseSecret(`whsec_${body}A`))).toBe('secret_invalid');
    expect(codeThrown(() => parseSecret(`${body}A`))).toBe('secret_invalid');
  });

  // Kills: the entry pattern taking `=` anywhere in the signature. Buffer.from stops decoding at the
  // padding, so a valid signature with anything glued after its `=` verified: a second spelling of
  // one signature, which a receiver logging or deduplicating entries would count as another.
  it('refuses a v1 entry with characters after its padding, though the bytes before it verify', () => {
    const verifier = createVerifier({ secret: SECRET, now: () => TS * 1000 });
    const verify = (entry: string) => {
      const result = verifier.verify({
        headers: { 'webhook-id': ID, 'webhook-timestamp': String(TS), 'webhook-signature': entry },
        body: BODY,
      });
      return result.ok ? 'ok' : result.error.code;
    };
    expect(signature.endsWith('=')).toBe(true);
    expect(verify(`v1,${signature}`)).toBe('ok');
    expect(verify(`v1,${signature}AAAA`)).toBe('header_invalid');
  });

  // Kills: a timestamp pattern of more than 15 digits. Past 15 digits the number is no longer sure to
  // be exact (2^53 has 16), and no clock of this era needs more than 10: such a header is malformed,
  // not merely "too new".
  it('calls a timestamp of 16 digits malformed', () => {
    const verifier = createVerifier({ secret: SECRET, now: () => TS * 1000 });
    const result = verifier.verify({
      headers: { 'webhook-id': ID, 'webhook-timestamp': '1'.repeat(16), 'webhook-signature': `v1,${signature}` },
      body: BODY,
    });
    expect(result.ok ? 'ok' : result.error.code).toBe('header_invalid');
  });
});
