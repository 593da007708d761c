// The guard's JWS layer on its own (verifyParsedJws: header rules, then the signature with the keys
// pinned to an algorithm), which the Wycheproof vectors run through. Written by a mutation pass: each
// test kills a mutant every other guard test let live (named in its comment).
import { describe, expect, it } from 'vitest';
import { jwsAlgorithms } from '../src/algorithms.js';
import { parseCompactJws } from '../src/compact-jws.js';
import { verifyParsedJws } from '../src/jws-verify.js';
import { importKeySet } from '../src/key-import.js';
import { b64url, signSegments, testKeys } from './support/tokens.js';

const keys = testKeys();

async function verifyWith(alg: string, signWith: Parameters<typeof signSegments>[3], jwk: Record<string, unknown>) {
  const imported = await importKeySet({ keys: [jwk] }, { algorithms: jwsAlgorithms, allowSymmetric: false });
  if (!imported.ok) throw new Error(`key set refused: ${imported.reason}`);
  const token = signSegments(b64url({ alg }), b64url({ sub: 'user-1' }), alg, signWith);
  const parsed = parseCompactJws(token);
  if (!parsed.ok) throw new Error(`token refused: ${parsed.reason}`);
  const result = await verifyParsedJws(parsed.value, imported.keys, []);
  return result.ok ? 'ok' : result.code;
}

describe('JWS layer (mutants)', () => {
  // Kills: verifyJwsSignature answering signature_invalid when no key was a candidate. A token
  // signed with an algorithm none of the keys is pinned to was never checked against any key: that is
  // the algorithm refused, and an operator reading the code looks at the issuer's algorithms, not at
  // the keys' material.
  it('a token in an algorithm no key is pinned to is algorithm_not_allowed, a wrong signature signature_invalid', async () => {
    const ec = { ...keys.ec.publicJwk, alg: 'ES256' };
    expect(await verifyWith('ES256', keys.ec.privateKey, ec)).toBe('ok');
    expect(await verifyWith('ES256', keys.ec2.privateKey, ec)).toBe('signature_invalid');
    expect(await verifyWith('RS256', keys.rsa.privateKey, ec)).toBe('algorithm_not_allowed');
  });

  // Kills: isJwsAlgorithm taking a spelling of `none`. Any case of it is no algorithm, refused by the
  // header rules before a key is looked at.
  it('refuses alg none in any case before any key is tried', async () => {
    const ed = { ...keys.ed.publicJwk, alg: 'EdDSA' };
    const imported = await importKeySet({ keys: [ed] }, { algorithms: jwsAlgorithms, allowSymmetric: false });
    if (!imported.ok) throw new Error(imported.reason);
    for (const alg of ['none', 'None', 'NONE', 'nOnE']) {
      for (const signature of ['', 'AAAA']) {
        const parsed = parseCompactJws(`${b64url({ alg })}.${b64url({ sub: 'user-1' })}.${signature}`);
        const result = parsed.ok
          ? await verifyParsedJws(parsed.value, imported.keys, [])
          : { ok: false, code: 'parse' };
        expect(result.ok ? 'ok' : (result as { code: string }).code, `${alg} "${signature}"`).toMatch(
          /^(algorithm_not_allowed|parse)$/,
        );
      }
    }
  });
});
