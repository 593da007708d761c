// Tests written by a mutation-testing pass over secrets.ts: each kills a mutant the other webhook
// tests let live (named in its comment).
import crypto from 'node:crypto';
import { syncBuiltinESMExports } from 'node:module';
import { describe, expect, it, vi } from 'vitest';
import { createVerifier } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const valid = crypto.createHmac('sha256', KEY).update(`${ID}.${TS}.${BODY}`).digest('base64');

describe('HMAC keys compute only when asked (mutants)', () => {
  // Kills: checkerFor computing the expected HMAC up front rather than on the first entry it checks.
  it('computes no HMAC for a key no entry reaches, and none past the key that verified', () => {
    const hmac = vi.spyOn(crypto, 'createHmac');
    syncBuiltinESMExports();
    try {
      const secrets = [SECRET, `whsec_${Buffer.alloc(24, 1).toString('base64')}`];
      const verifier = createVerifier({ secret: secrets, now: () => TS * 1000 });
      const headers = (signature: string) => ({
        'webhook-id': ID,
        'webhook-timestamp': String(TS),
        'webhook-signature': signature,
      });
      hmac.mockClear();
      expect(verifier.verify({ headers: headers(`v1,${valid}`), body: BODY }).ok).toBe(true);
      expect(hmac).toHaveBeenCalledTimes(1);
      hmac.mockClear();
      const onlyEd25519 = `v1a,${Buffer.alloc(64, 3).toString('base64')}`;
      expect(verifier.verify({ headers: headers(onlyEd25519), body: BODY }).ok).toBe(false);
      expect(hmac).not.toHaveBeenCalled();
    } finally {
      hmac.mockRestore();
      syncBuiltinESMExports();
    }
  });
});
