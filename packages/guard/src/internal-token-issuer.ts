import type { JWK } from 'jose';
import type { InternalSigningKey } from './internal-signing-keys.js';
import type { Principal } from './principal.js';

/**
 * Mints the gateway's internal tokens and publishes their keys.
 *
 * @example
 * const token = await issuer.mint(principal, { audience: 'orders-service' });
 */
export interface InternalTokenIssuer {
  readonly issuer: string;
  /** The kid of the key that signs now (after a `rotate()`, the previous one until the delay has passed). */
  readonly currentKid: string;
  /** Mints a token for one upstream (`aud`) carrying the caller's identity. */
  mint(principal: Principal, options: { audience: string }): Promise<string>;
  /**
   * The public keys as a JWKS, for services to verify with (serve it, or pass it to
   * `createInternalVerifier`): a key waiting to sign, the current one, and older ones while their
   * tokens may still verify (and up to `maxPublishedKeys`, except keys an immediate rotation
   * withdrew). Ask again after a `rotate()`.
   */
  jwks(): { keys: JWK[] };
  /**
   * Publishes `key` (default: a fresh Ed25519 key) in `jwks()` at once and makes it the signing key
   * once `delay` seconds have passed (default: the `rotationDelay` option, 60). The current key signs
   * until then and stays published until its last tokens expired. `delay: 0` switches at once, for a
   * key known to be compromised: the keys before it are withdrawn from `jwks()` once their own tokens
   * expired (not kept for `maxPublishedKeys`), and services that fetched the JWKS within their cooldown
   * refuse the new tokens (`key_unknown`) until it ends. Returns the new kid.
   */
  rotate(key?: InternalSigningKey, options?: { delay?: number | undefined }): string;
}
