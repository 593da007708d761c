import { createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { importJWK, type JWK } from 'jose';
import { jwkThumbprint, publicJwkOf } from './key-import.js';

/**
 * A signing key of the gateway: Ed25519 (EdDSA) or P-256 (ES256).
 *
 * @example
 * const key: InternalSigningKey = { kid: 'gw-2026-01', privateKey: readFileSync('gateway.pem', 'utf8') };
 */
export interface InternalSigningKey {
  /** Key id published in the JWKS (default: the RFC 7638 thumbprint). */
  kid?: string | undefined;
  /** The private key: a `KeyObject`, PKCS#8 PEM, or a private JWK. */
  privateKey: KeyObject | string | Record<string, unknown>;
}

/** One imported signing key and the time (epoch ms) from which it signs. */
export interface SigningEntry {
  kid: string;
  alg: 'EdDSA' | 'ES256';
  publicJwk: JWK;
  signingKey: Promise<CryptoKey>;
  /** From when it signs; `-Infinity` for the configured current key. */
  activeFrom: number;
  /** Published at least until then whatever else holds (older configured keys: a previous run's tokens). */
  keepUntil?: number;
  /**
   * Superseded by a rotation that signed at once (a compromised key): published only while its own
   * tokens may still verify, never kept for `maxPublished`.
   */
  withdrawn?: boolean;
}

/**
 * Imports a signing key (a fresh Ed25519 key when `input` is undefined). Throws a `TypeError` for a
 * key that is not a private Ed25519 or P-256 key.
 *
 * @example
 * const entry = toSigningEntry({ kid: 'gw-1', privateKey: pem }, Number.NEGATIVE_INFINITY);
 */
export function toSigningEntry(input: InternalSigningKey | undefined, activeFrom: number): SigningEntry {
  let privateKey: KeyObject;
  if (input === undefined) privateKey = generateKeyPairSync('ed25519').privateKey;
  else if (typeof input.privateKey === 'string') privateKey = createPrivateKey(input.privateKey);
  else if ('asymmetricKeyType' in input.privateKey) privateKey = input.privateKey as KeyObject;
  else privateKey = createPrivateKey({ key: input.privateKey as never, format: 'jwk' });
  if (privateKey.type !== 'private') throw new TypeError('internal token keys must be private keys');
  let alg: 'EdDSA' | 'ES256';
  if (privateKey.asymmetricKeyType === 'ed25519') alg = 'EdDSA';
  else if (privateKey.asymmetricKeyType === 'ec' && privateKey.asymmetricKeyDetails?.namedCurve === 'prime256v1') {
    alg = 'ES256';
  } else throw new TypeError('internal token keys must be Ed25519 (EdDSA) or P-256 (ES256)');
  // Public members only: the JWKS is published, and a runtime's export may list more (see publicJwkOf).
  const publicJwk: JWK = publicJwkOf(createPublicKey(privateKey));
  const kid = input?.kid ?? jwkThumbprint(publicJwk);
  const privateJwk = privateKey.export({ format: 'jwk' }) as JWK;
  const signingKey = importJWK(privateJwk, alg) as Promise<CryptoKey>;
  signingKey.catch(() => {});
  return { kid, alg, publicJwk: { ...publicJwk, kid, alg, use: 'sig' }, signingKey, activeFrom };
}

// A verifier accepts a token until `exp` plus its clock tolerance, which is at most 60 s.
const maxVerifierToleranceMs = 60_000;

/** The gateway's signing keys over time: which one signs now, and which ones `jwks()` must publish. */
export interface SigningKeyRing {
  /** The key that signs at `at`: the newest one whose `activeFrom` has come. */
  signer(at: number): SigningEntry;
  /** The keys to publish at `at`, newest first. */
  published(at: number): SigningEntry[];
  /**
   * Adds `entry` as the newest key. Throws a `TypeError` for a kid already held. An entry that signs
   * at once (`activeFrom <= at`) withdraws the keys before it: see {@link SigningEntry.withdrawn}.
   */
  add(entry: SigningEntry, at: number): void;
}

/**
 * The rotation timeline (research section 4, lesson 2, applied to the gateway's own keys):
 *
 * ```text
 * rotate() at t     t + delay                  t + delay + ttl + 60 s
 * │ new key in the  │ new key signs; the old   │ the old key's last tokens
 * │ JWKS, old signs │ one stays published      │ have expired: it may go
 * ```
 *
 * A service that fetched the JWKS just before `t` sees the new `kid` first at `t + delay` and fetches
 * again once its cooldown has passed, so a delay of at least the services' cooldown means no token is
 * ever refused for an unknown key. A key stays published while a token it signed may still verify:
 * `ttl` after a newer key took over, plus the largest clock tolerance a verifier may allow. Beyond
 * that, `maxPublished` keys (newest first) stay published as before; a key still needed is never
 * dropped for the bound, so rotating in quick succession cannot unpublish the key that signs.
 *
 * @example
 * const ring = signingKeyRing([toSigningEntry(undefined, Number.NEGATIVE_INFINITY)], { ttlMs: 60_000, maxPublished: 3, at: Date.now() });
 * ring.add(toSigningEntry(undefined, Date.now() + 60_000), Date.now());
 */
export function signingKeyRing(
  initial: readonly SigningEntry[],
  options: { ttlMs: number; maxPublished: number; at: number },
): SigningKeyRing {
  const liveMs = options.ttlMs + maxVerifierToleranceMs;
  // Newest first. The configured older keys signed in a previous run of the gateway (or elsewhere):
  // their tokens may be live for one lifetime after this start.
  let entries: SigningEntry[] = initial.map((entry, index) =>
    index === 0 ? entry : { ...entry, keepUntil: options.at + liveMs },
  );
  if (new Set(entries.map((entry) => entry.kid)).size !== entries.length) throw new TypeError('duplicate internal kid');

  // Whether the key at `index` may still have signed tokens that verify, or will sign, at `at`.
  function needed(list: readonly SigningEntry[], index: number, at: number): boolean {
    const entry = list[index] as SigningEntry;
    if (entry.keepUntil !== undefined && at < entry.keepUntil) return true;
    // It signs until the first newer key becomes active.
    let supersededAt = Number.POSITIVE_INFINITY;
    for (let newer = 0; newer < index; newer++) {
      supersededAt = Math.min(supersededAt, (list[newer] as SigningEntry).activeFrom);
    }
    // A newer key that takes over no later than this one starts: this one never signs here.
    if (supersededAt <= entry.activeFrom) return false;
    return at < supersededAt + liveMs;
  }

  const kept = (list: readonly SigningEntry[], at: number) =>
    list.filter((entry, index) => (index < options.maxPublished && !entry.withdrawn) || needed(list, index, at));

  // The configured current key is active from -Infinity and never dropped while it signs.
  const signerAt = (at: number) =>
    (entries.find((entry) => entry.activeFrom <= at) ?? entries[entries.length - 1]) as SigningEntry;

  return {
    signer: signerAt,
    published(at) {
      return kept(entries, at);
    },
    add(entry, at) {
      if (entries.some((existing) => existing.kid === entry.kid)) throw new TypeError('duplicate internal kid');
      let older = entries;
      if (entry.activeFrom <= at) {
        // Only a key known to be compromised is rotated out at once (`rotate(key, { delay: 0 })`).
        // Kept published for maxPublished, it would verify whatever its thief signs, for good. The key
        // signing until now may have signed this very millisecond: its tokens are kept for their life.
        const signing = signerAt(at);
        older = entries.map((old) => ({
          ...old,
          withdrawn: true,
          ...(old === signing ? { keepUntil: at + liveMs } : {}),
        }));
      }
      entries = kept([entry, ...older], at);
    },
  };
}
