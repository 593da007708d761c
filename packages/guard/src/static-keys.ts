import type { hmacMinimumBytes, JwsAlgorithm } from './algorithms.js';
import { isPlainObject } from './compact-jws.js';
import type { IssuerOptions, PemKeyInput } from './guard-options.js';
import { secretToJwk, secretWeakness } from './hmac-secret.js';
import { checkJwk, importCheckedKey, type KeyPolicy, kidSlot, pemToJwk, type VerificationKey } from './key-import.js';

export function staticKeys(
  options: IssuerOptions,
  algorithms: readonly JwsAlgorithm[],
): Promise<VerificationKey[]> | undefined {
  const inputs: Array<Record<string, unknown>> = [];
  let symmetric = false;
  if (options.secret !== undefined) {
    symmetric = true;
    if (!algorithms.every((alg) => alg.startsWith('HS'))) {
      throw new TypeError(`issuer ${options.issuer}: a secret only verifies HS algorithms`);
    }
    // One key, one algorithm (RFC 8725 §3.1): the secret is pinned to its algorithm, so with two listed
    // every token of the second was key_unknown for good, and nothing said so at startup.
    if (algorithms.length !== 1) {
      throw new TypeError(
        `issuer ${options.issuer}: a secret verifies one algorithm; list one (got ${algorithms.join(', ')})`,
      );
    }
    const alg = algorithms[0] as keyof typeof hmacMinimumBytes;
    const jwk = secretToJwk(options.secret);
    // Checked here, where the algorithm is known, so the error names the minimum rather than the
    // bare `weak-key` the key check below would give.
    const weakness = secretWeakness(options.secret, alg);
    if (weakness !== undefined) throw new TypeError(`issuer ${options.issuer}: ${weakness}`);
    inputs.push({ ...jwk, alg });
  }
  for (const input of options.publicKeys ?? []) {
    if (typeof input === 'string') inputs.push(pemToJwk(input));
    else if ('pem' in input && typeof input.pem === 'string') {
      const pem = input as PemKeyInput;
      inputs.push({
        ...pemToJwk(pem.pem),
        ...(pem.kid === undefined ? {} : { kid: pem.kid }),
        ...(pem.alg === undefined ? {} : { alg: pem.alg }),
      });
    } else inputs.push(input as Record<string, unknown>);
  }
  if (options.jwks !== undefined) {
    if (!isPlainObject(options.jwks) || !Array.isArray(options.jwks.keys)) {
      throw new TypeError(`issuer ${options.issuer}: jwks must be { keys: [...] }`);
    }
    for (const key of options.jwks.keys) inputs.push(key as Record<string, unknown>);
  }
  if (inputs.length === 0) return undefined;
  if (symmetric && inputs.length > 1) {
    throw new TypeError(`issuer ${options.issuer}: a secret cannot be combined with other keys`);
  }
  const policy: KeyPolicy = { algorithms, allowSymmetric: symmetric };
  const kids = new Set<string>();
  const checked = inputs.map((input, index) => {
    if (!symmetric && ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k'].some((member) => member in input)) {
      throw new TypeError(`issuer ${options.issuer}: key ${index} holds private or symmetric material`);
    }
    const result = checkJwk(input, policy);
    if (!result.ok) throw new TypeError(`issuer ${options.issuer}: key ${index} refused (${result.reason})`);
    // As in a fetched set: one kid may name a key for two algorithms, never two keys for one.
    if (result.key.kid !== undefined) {
      const slot = kidSlot(result.key.kid, result.key.alg);
      if (kids.has(slot)) throw new TypeError(`issuer ${options.issuer}: duplicate kid ${result.key.kid}`);
      kids.add(slot);
    }
    return result.key;
  });
  return Promise.all(checked.map(importCheckedKey));
}

// The construction-time read of a `jwks` function. Its own error would name no option; as a bad set
// is, a throw here is a TypeError that says which issuer's function failed (the error is its cause).
// Later reads that throw are `keys_unavailable` (see liveKeySource).
export function readJwks(read: () => { keys: readonly unknown[] }, options: IssuerOptions) {
  try {
    return read();
  } catch (cause) {
    throw new TypeError(`issuer ${options.issuer}: the jwks function threw when read at construction`, { cause });
  }
}
