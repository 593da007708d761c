// A DPoP proof carries its sender's own key, and its signature is checked before the access token
// is: any sender, with any token, makes the guard verify with the key it chose. RSA verification
// grows with the modulus (52 µs at 2048 bits, 227 µs at 4096, 605 µs at 8192 here), and the
// default maxHeaderLength lets an 8192-bit key through: twelve times an ordinary proof's work per
// request, for free. A proof's RSA key past 4096 bits is refused before any verification.
import { generateKeyPair, type KeyObject } from 'node:crypto';
import { promisify } from 'node:util';
import { calculateJwkThumbprint, type JWK } from 'jose';
import { beforeAll, describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import {
  AUDIENCE,
  b64url,
  ISSUER,
  makeToken,
  manualClock,
  proofClaims,
  SECRET,
  signSegments,
} from './support/tokens.js';

const ORIGIN = 'https://api.example';
const generate = promisify(generateKeyPair);

async function rsaPair(bits: number) {
  const { publicKey, privateKey } = await generate('rsa', { modulusLength: bits });
  return { privateKey, publicJwk: publicKey.export({ format: 'jwk' }) as JWK };
}

describe('the size of a DPoP proof’s RSA key', () => {
  let at4096: Awaited<ReturnType<typeof rsaPair>>;
  let at4104: Awaited<ReturnType<typeof rsaPair>>;
  beforeAll(async () => {
    // A few seconds: the two are made side by side, on libuv's threads.
    [at4096, at4104] = await Promise.all([rsaPair(4096), rsaPair(4104)]);
  }, 60_000);

  const attempt = async (key: { privateKey: KeyObject; publicJwk: JWK }) => {
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      dpop: { origin: ORIGIN, algorithms: ['RS256'] },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const jkt = await calculateJwkThumbprint(key.publicJwk, 'sha256');
    const accessToken = makeToken({ claims: { cnf: { jkt } } });
    const claims = {
      ...proofClaims(accessToken, `${ORIGIN}/orders`, clock.seconds()),
    };
    const header = { typ: 'dpop+jwt', alg: 'RS256', jwk: key.publicJwk };
    const dpop = signSegments(b64url(header), b64url(claims), 'RS256', key.privateKey);
    const result = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop },
    });
    return result.ok ? 'ok' : result.error.code;
  };

  it('takes a proof signed with a 4096-bit key', async () => {
    expect(await attempt(at4096)).toBe('ok');
  });

  it('refuses a proof whose key is one byte past 4096 bits, though it verifies', async () => {
    expect(await attempt(at4104)).toBe('dpop_proof_invalid');
  });
});
