// Audit of the receiver against Standard Webhooks: one delivery has one spelling. A signature entry
// is the base64 of the signature bytes, and the reference library (standardwebhooks) compares that
// text, so another spelling of the same bytes (no padding, padding bits set) is refused there; here
// Buffer.from decoded it leniently and it verified: a second spelling of one signature, which the
// entry pattern already refuses for characters after the padding (strict-encodings.audit.test.ts).
// And two field lines for one name are malformed (headers.ts): a plain header object that holds one
// name in two spellings (`webhook-signature` and `Webhook-Signature`, as a hand-built or a Lambda
// event's map may) is two field lines, and must not have one of them silently picked.
import { memoryStore } from '@idem/core';
import { Webhook } from 'standardwebhooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createReceiver, createVerifier, generateSecret, sign } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const signed = sign({ secret: SECRET, id: ID, body: BODY, timestamp: TS });
const entry = signed['webhook-signature'].slice('v1,'.length);
const at = () => TS * 1000;

/** The same bytes in another base64 spelling: the unused low bits of the last character set. */
const withPaddingBitsSet = (base64: string) => {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  const body = base64.replace(/=+$/, '');
  const last = alphabet.indexOf(body.at(-1) as string);
  const unused = base64.endsWith('==') ? 0b1111 : 0b11;
  return `${body.slice(0, -1)}${alphabet[last | unused]}${base64.slice(body.length)}`;
};

const codeOf = (signature: string, headers: Record<string, string> = {}) => {
  const result = createVerifier({ secret: SECRET, now: at }).verify({
    headers: { ...signed, 'webhook-signature': signature, ...headers },
    body: BODY,
  });
  return result.ok ? 'ok' : result.error.code;
};

afterEach(() => {
  vi.useRealTimers();
});

describe('one signature, one spelling', () => {
  it('the respelt entries decode to the very bytes of the valid one (the test is about spelling only)', () => {
    for (const other of [entry.replace(/=+$/, ''), withPaddingBitsSet(entry)]) {
      expect(other).not.toBe(entry);
      expect(Buffer.from(other, 'base64').equals(Buffer.from(entry, 'base64'))).toBe(true);
    }
  });

  it('standardwebhooks refuses them', () => {
    vi.useFakeTimers({ now: at(), toFake: ['Date'] });
    const theirs = new Webhook(SECRET);
    expect(() => theirs.verify(BODY, signed)).not.toThrow();
    for (const other of [entry.replace(/=+$/, ''), withPaddingBitsSet(entry)]) {
      expect(() => theirs.verify(BODY, { ...signed, 'webhook-signature': `v1,${other}` })).toThrow();
    }
  });

  it('a v1 entry without its padding, or with its padding bits set, is malformed; the canonical one verifies', () => {
    expect(codeOf(`v1,${entry}`)).toBe('ok');
    expect(codeOf(`v1,${entry.replace(/=+$/, '')}`)).toBe('header_invalid');
    expect(codeOf(`v1,${withPaddingBitsSet(entry)}`)).toBe('header_invalid');
  });

  it('so is such a v1a entry', () => {
    const pair = generateSecret('v1a') as { privateKey: string; publicKey: string };
    const headers = sign({ secret: pair.privateKey, id: ID, body: BODY, timestamp: TS });
    const v1a = headers['webhook-signature'].slice('v1a,'.length);
    const verifier = createVerifier({ secret: pair.publicKey, now: at });
    const check = (signature: string) => {
      const result = verifier.verify({ headers: { ...headers, 'webhook-signature': signature }, body: BODY });
      return result.ok ? 'ok' : result.error.code;
    };
    expect(check(`v1a,${v1a}`)).toBe('ok');
    expect(check(`v1a,${v1a.replace(/=+$/, '')}`)).toBe('header_invalid');
    expect(check(`v1a,${withPaddingBitsSet(v1a)}`)).toBe('header_invalid');
  });

  it('a receiver answers such a delivery 400 and records nothing', async () => {
    const applied: string[] = [];
    const receiver = createReceiver({
      store: memoryStore(),
      secret: SECRET,
      now: at,
      apply: (event) => {
        applied.push(event.id);
      },
      onWarning: () => undefined,
    });
    const respelt = await receiver.handle({
      headers: { ...signed, 'webhook-signature': `v1,${withPaddingBitsSet(entry)}` },
      body: BODY,
    });
    expect(respelt.outcome).toBe('rejected');
    expect(respelt.status).toBe(400);
    expect((await receiver.handle({ headers: signed, body: BODY })).outcome).toBe('applied');
    expect(applied).toEqual([ID]);
  });
});

describe('one name in two spellings in a plain header object', () => {
  it('is malformed, whichever of the two verifies', () => {
    const bad = `v1,${Buffer.alloc(32).toString('base64')}`;
    expect(codeOf(bad, { 'Webhook-Signature': signed['webhook-signature'] })).toBe('header_invalid');
    expect(codeOf(signed['webhook-signature'], { 'Webhook-Signature': bad })).toBe('header_invalid');
    expect(codeOf(signed['webhook-signature'], { 'WEBHOOK-ID': 'msg_other' })).toBe('header_invalid');
    expect(codeOf(signed['webhook-signature'], { 'Webhook-Timestamp': String(TS) })).toBe('header_invalid');
  });

  it('one spelling alone, in any case, still verifies', () => {
    const { 'webhook-signature': signature, ...rest } = signed;
    expect(codeOf(signature)).toBe('ok');
    const result = createVerifier({ secret: SECRET, now: at }).verify({
      headers: { ...rest, 'Webhook-Signature': signature },
      body: BODY,
    });
    expect(result.ok).toBe(true);
  });
});
