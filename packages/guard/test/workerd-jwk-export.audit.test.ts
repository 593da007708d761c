import * as nodeCrypto from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { createGuard, createInternalTokenIssuer, createInternalVerifier, principalFromClaims } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, START_MS } from './support/tokens.js';

// Cloudflare Workers (workerd, with nodejs_compat) exports a public KeyObject as a JWK that lists every
// member JWK defines, the private ones with the value `undefined`, and adds `alg: 'EdDSA'` to Ed25519
// keys. Seen in workerd 1.20260426.1 (Miniflare 4):
//   createPublicKey(pem).export({ format: 'jwk' })
//   → { kty: 'OKP', use: undefined, key_ops: undefined, alg: 'EdDSA', ext: undefined, crv: 'Ed25519',
//       x: '...', y: undefined, d: undefined, n: undefined, ..., k: undefined }
// Node gives `{ crv, x, kty }`. This replays that shape on Node's real keys.
const workerdMembers = ['kty', 'use', 'key_ops', 'alg', 'ext', 'crv', 'x', 'y', 'd', 'n', 'e'];
const workerdMore = ['p', 'q', 'dp', 'dq', 'qi', 'oth', 'k'];
vi.mock('node:crypto', async (importOriginal) => {
  const real = await importOriginal<typeof nodeCrypto>();
  const workerdStyle = (key: nodeCrypto.KeyObject): nodeCrypto.KeyObject => {
    const exportReal = key.export.bind(key);
    Object.defineProperty(key, 'export', {
      value: (options?: { format?: string }) => {
        const out = exportReal(options as never);
        if (options?.format !== 'jwk' || key.type !== 'public') return out;
        const shaped: Record<string, unknown> = {};
        for (const member of [...workerdMembers, ...workerdMore])
          shaped[member] = (out as unknown as Record<string, unknown>)[member];
        if (key.asymmetricKeyType === 'ed25519') shaped.alg = 'EdDSA';
        return shaped;
      },
    });
    return key;
  };
  return {
    ...real,
    default: real,
    createPublicKey: (...args: Parameters<typeof real.createPublicKey>) => workerdStyle(real.createPublicKey(...args)),
  };
});

const { generateKeyPairSync } = nodeCrypto;

describe('JWKs exported by a runtime that lists absent members as undefined (workerd)', () => {
  it('a PEM public key configured for an issuer is taken as a public key, not refused as private material', async () => {
    const { publicKey, privateKey } = generateKeyPairSync('ed25519');
    const pem = publicKey.export({ type: 'spki', format: 'pem' }).toString();
    const clock = manualClock(START_MS);
    // Was: TypeError "issuer ...: key 0 holds private or symmetric material" at construction.
    const guard = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, publicKeys: [pem] }], now: clock.now });
    // Ed25519 is the fully-specified name: a PEM key without `alg` verifies it, as on Node.
    for (const alg of ['EdDSA', 'Ed25519'] as const) {
      const token = makeToken({ alg, key: privateKey });
      const result = await guard.authenticate({ headers: { authorization: `Bearer ${token}` } });
      expect(result.ok, alg).toBe(true);
    }
  });

  it("the gateway's published JWKS holds only public members, and an in-process verifier takes it", async () => {
    const issuer = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
    const published = issuer.jwks().keys;
    expect(published).toHaveLength(1);
    expect(Object.keys(published[0] as object).sort()).toEqual(['alg', 'crv', 'kid', 'kty', 'use', 'x']);
    // Was: TypeError "issuer https://gateway.example: key 0 holds private or symmetric material".
    const verifier = createInternalVerifier({
      issuer: 'https://gateway.example',
      audience: 'orders-service',
      jwks: () => issuer.jwks(),
    });
    const principal = principalFromClaims({ iss: ISSUER, sub: 'alice', aud: AUDIENCE, scope: 'orders:write' });
    const token = await issuer.mint(principal, { audience: 'orders-service' });
    const result = await verifier.verify(token);
    expect(result.ok && result.principal.sub).toBe('alice');
  });
});
