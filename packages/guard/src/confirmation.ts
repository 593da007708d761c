import { timingSafeEqual } from 'node:crypto';
import { isPlainObject } from './compact-jws.js';
import type { GuardErrorCode } from './errors.js';

/**
 * What a request proved it holds, for a token's `cnf` (RFC 7800) to be checked against.
 *
 * @example
 * const presented: PresentedBinding = { jkt: proof.jkt, certificate: () => thumbprint };
 */
export interface PresentedBinding {
  /** The RFC 7638 thumbprint of the key of a verified DPoP proof (RFC 9449). */
  jkt?: string | undefined;
  /**
   * Set only where the guard checks certificate bindings (`mtls`): the RFC 8705 thumbprint of the
   * client certificate the request came with, or undefined when it came with none. A function, so
   * the certificate is read only for a token bound to one.
   */
  certificate?: (() => string | undefined) | undefined;
}

// 32 bytes of SHA-256 in canonical base64url: 43 characters, the last one carrying 4 bits (so its
// 2 trailing bits zero: 16 of the 64), no padding. Anything else matches no certificate and is a
// broken claim.
const thumbprintShape = /^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$/;

// Both are 43 ASCII characters here (the claim checked by shape, the other computed), so the
// buffers have one length and the compare takes the same time wherever they differ.
const sameThumbprint = (claimed: string, presented: string) =>
  claimed.length === presented.length && timingSafeEqual(Buffer.from(claimed), Buffer.from(presented));

/**
 * Checks a verified token's `cnf` against what the request presented. Returns the refusal, or
 * undefined when every binding the token carries holds.
 *
 * Without certificate checks (no `mtls`), as before them: with a DPoP proof, `cnf.jkt` must be its
 * key; without one, any `cnf` is `token_bound`. With them, each binding the token carries must
 * hold: `x5t#S256` (a malformed one is `claim_invalid`; no certificate is `certificate_missing`,
 * another one `certificate_mismatch`) and `jkt` (a proof of that key). A `cnf` holding neither, or a
 * `jkt` without a proof, is still `token_bound`: a binding this request did not satisfy.
 *
 * @example
 * checkConfirmation({ 'x5t#S256': x5t }, { certificate: () => x5t }); // undefined
 */
export function checkConfirmation(cnf: unknown, presented: PresentedBinding): GuardErrorCode | undefined {
  const { jkt, certificate } = presented;
  if (certificate === undefined) {
    if (jkt !== undefined) {
      // Presented with a DPoP proof: the token must be bound to exactly the proof's key (RFC 9449 §6).
      if (typeof cnf !== 'object' || cnf === null || (cnf as { jkt?: unknown }).jkt !== jkt) {
        return 'token_binding_invalid';
      }
      // Bound to a certificate too, which this guard (no `mtls`) cannot check: refused, as a bound
      // token without its proof is. Passing it on the proof alone would let a holder of the DPoP key
      // without the certificate through, while a guard with `mtls` asks for both.
      return Object.hasOwn(cnf, 'x5t#S256') ? 'token_bound' : undefined;
    }
    // A sender-constrained token (DPoP `cnf.jkt`, mTLS `cnf.x5t#S256`) is not a bearer token.
    return cnf === undefined ? undefined : 'token_bound';
  }
  if (cnf === undefined) return jkt === undefined ? undefined : 'token_binding_invalid';
  if (!isPlainObject(cnf)) return jkt === undefined ? 'token_bound' : 'token_binding_invalid';
  const x5t = Object.hasOwn(cnf, 'x5t#S256') ? cnf['x5t#S256'] : undefined;
  if (x5t !== undefined) {
    if (typeof x5t !== 'string' || !thumbprintShape.test(x5t)) return 'claim_invalid';
    const held = certificate();
    if (held === undefined) return 'certificate_missing';
    if (!sameThumbprint(x5t, held)) return 'certificate_mismatch';
  }
  const boundKey = Object.hasOwn(cnf, 'jkt') ? cnf.jkt : undefined;
  if (jkt !== undefined) return boundKey === jkt ? undefined : 'token_binding_invalid';
  // No proof: only a token bound by its certificate alone passes. A `jkt` asks for a proof this
  // request did not bring; a `cnf` without `x5t#S256` binds the token some way this guard cannot check.
  return x5t !== undefined && boundKey === undefined ? undefined : 'token_bound';
}
