// receiver.handle() (and the verifier under it) took any object with `get` and `has` for a fetch
// `Headers`, whose get() is case-insensitive. A `Map` has both, but its keys are exact: a delivery
// whose headers arrived as `Webhook-Id` (a gateway that keeps the client's spelling, a hand-built
// map) was `headers_missing`. A Map is read as a plain object is: names in any case, and one name in
// two spellings is two field lines, `header_invalid`.
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { createReceiver, createVerifier, sign } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const signed = sign({ secret: SECRET, id: ID, body: BODY, timestamp: TS });
const at = () => TS * 1000;
const codeOf = (map: Map<string, string>) => {
  const result = createVerifier({ secret: SECRET, now: at }).verify({ headers: map, body: BODY });
  return result.ok ? 'ok' : result.error.code;
};

describe('a Map of headers', () => {
  it('is read case-insensitively by receiver.handle()', async () => {
    const receiver = createReceiver({
      secret: SECRET,
      store: memoryStore({ now: at }),
      now: at,
      apply: () => undefined,
    });
    const headers = new Map([
      ['Webhook-Id', signed['webhook-id']],
      ['Webhook-Timestamp', signed['webhook-timestamp']],
      ['Webhook-Signature', signed['webhook-signature']],
      ['Content-Type', 'application/json'],
    ]);
    const response = await receiver.handle({ headers, body: BODY });
    expect(response.status).toBe(200);
  });

  it('in lower case verifies as before', () => {
    expect(codeOf(new Map(Object.entries(signed)))).toBe('ok');
  });

  it('holding one name in two spellings is header_invalid, as a plain object is', () => {
    const twice = new Map([...Object.entries(signed), ['WEBHOOK-ID', 'msg_other']]);
    expect(codeOf(twice)).toBe('header_invalid');
  });
});
