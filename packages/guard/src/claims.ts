import { checkConfirmation, type PresentedBinding } from './confirmation.js';
import type { GuardErrorCode } from './errors.js';
import { isWordList } from './principal.js';

/** The claim rules of one issuer. Durations are in seconds. */
export interface ClaimProfile {
  /** Accepted audiences; the token's audience claim must contain at least one. */
  audiences: readonly string[];
  /** The claim holding the audience: `aud`, or another one (Cognito's `client_id`). */
  audienceClaim: string;
  /** Allowed clock skew for `exp`, `nbf` and `iat`. */
  clockTolerance: number;
  /** Maximum age since `iat` (then `iat` is required). */
  maxTokenAge: number | undefined;
  /** Maximum `exp - iat` (or `exp - nbf`, or `exp - now` without either). */
  maxLifetime: number | undefined;
  /** Claims that must be present besides `iss`, `sub`, `aud`, `exp`. */
  requiredClaims: readonly string[];
  /** Claims that must hold one of their accepted values (`claimValues`), as pairs. */
  claimValues: ReadonlyArray<readonly [string, readonly ClaimValue[]]>;
}

/** A value `claimValues` compares a claim with: exactly, by type and value. */
export type ClaimValue = string | number | boolean;

/**
 * A NumericDate as the guard accepts it: a non-negative safe integer. Strings, booleans, null,
 * Infinity (`1e999`), negatives and fractions are refused (Hono CVE-2026-44459; research case 31).
 *
 * @example
 * isNumericDate(1767225600); // true
 * isNumericDate('1767225600'); // false
 */
export function isNumericDate(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** Whether `aud` is a non-empty string or a non-empty array of non-empty strings. */
function audienceList(value: unknown): string[] | undefined {
  if (typeof value === 'string') return value.length > 0 ? [value] : undefined;
  if (!Array.isArray(value) || value.length === 0) return undefined;
  for (const item of value) if (typeof item !== 'string' || item.length === 0) return undefined;
  return value as string[];
}

// A scope claim: a space-delimited string, or an array of scope tokens. An array item holding a space
// is no scope token (RFC 6749 §3.3): here it would be one scope nobody can require, and behind the
// gateway, which passes scopes on as one space-delimited string, two scopes the edge never granted.
// Other whitespace (a tab, a line break) is in no scope token either, in an item or in the string: a
// service behind that splits on any whitespace would read scopes the edge read as one.
const otherWhitespace = /[^\S ]/;
const isScopeList = (value: unknown): boolean =>
  isWordList(value) &&
  (typeof value === 'string' ? !otherWhitespace.test(value) : (value as string[]).every((item) => !/\s/.test(item)));

// A subject names someone: not empty, not blank (whitespace or invisible characters only), and free of control
// characters (C0, DEL, C1), of the line and paragraph separators (U+2028/9, line breaks that are no
// control characters: str.splitlines() and log viewers end a line there) and of the bidirectional
// controls (U+061C, U+200E/F, U+202A-E, U+2066-9).
// `sub` keys the idempotency scope and the audit lines: a blank one is one shared "nobody" for every
// such token, a line break or NUL in it forges or cuts a log line, and a right-to-left override shows
// a line's text in another order than it holds (the "Trojan Source" reordering). Joiners (U+200C/D)
// stay: scripts and emoji spell names with them.
const controlCharacter = /[\p{Cc}\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/u;
// Blank to the eye although no whitespace to trim(): it needs one character that is none of
// whitespace, a format character (U+200B zero width space, U+FEFF, the joiners), the Hangul fillers
// (U+115F, U+1160, U+3164, U+FFA0) or the blank braille pattern (U+2800). 'ZWSP' alone is "nobody" too.
const visibleCharacter = /[^\s\p{Cf}\u115f\u1160\u3164\uffa0\u2800]/u;
const isSubject = (value: unknown): value is string =>
  typeof value === 'string' && visibleCharacter.test(value) && !controlCharacter.test(value);

// A claim the token itself carries. The payload is a plain object, so `payload.constructor` or
// `payload.toString` would be what every object inherits: a rule requiring a claim of that name
// would pass a token without it.
const ownClaim = (payload: Record<string, unknown>, name: string): unknown =>
  Object.hasOwn(payload, name) ? payload[name] : undefined;

/**
 * Checks the claims of a token whose signature already verified. Returns the error code of the first
 * failed rule, or `undefined` when every rule holds. `nowMs` is the injected clock; `presented` is what
 * the request proved it holds (a DPoP proof's key, a client certificate), checked against `cnf` last.
 *
 * @example
 * checkClaims(payload, profile, Date.now()); // undefined, or 'token_expired', 'audience_invalid', ...
 */
export function checkClaims(
  payload: Record<string, unknown>,
  profile: ClaimProfile,
  nowMs: number,
  presented: PresentedBinding = {},
): GuardErrorCode | undefined {
  const now = nowMs / 1000;
  const tolerance = profile.clockTolerance;
  const { exp, nbf, iat } = payload;

  if (!isSubject(payload.sub)) return 'claim_invalid';
  if (!isNumericDate(exp)) return 'claim_invalid';
  if (nbf !== undefined && !isNumericDate(nbf)) return 'claim_invalid';
  if (iat !== undefined && !isNumericDate(iat)) return 'claim_invalid';
  // Non-empty, as `sub`: an empty one names no token and no client, yet would satisfy `requiredClaims`
  // (RFC 9068 §2.2) and travel on behind the gateway as the caller's client.
  for (const name of ['jti', 'client_id'] as const) {
    const value = payload[name];
    if (value !== undefined && (typeof value !== 'string' || value.length === 0)) return 'claim_invalid';
  }
  // RFC 9068 makes `scope` one space-delimited string; Duende IdentityServer emits an array of them by
  // default. Read alike (the principal takes each item as one scope); anything else is refused.
  if (payload.scope !== undefined && !isScopeList(payload.scope)) return 'claim_invalid';
  if (payload.scp !== undefined && !isScopeList(payload.scp)) return 'claim_invalid';
  // A required claim sent empty names nothing, as an empty `sub` or `client_id` does: missing.
  for (const name of profile.requiredClaims) {
    const value = ownClaim(payload, name);
    if (value === undefined || value === '') return 'claim_invalid';
  }
  for (const [name, accepted] of profile.claimValues) {
    if (!accepted.includes(ownClaim(payload, name) as ClaimValue)) return 'claim_invalid';
  }

  // RFC 7519 §4.1.4: the current time must be before `exp`; equality is expired.
  if (now >= exp + tolerance) return 'token_expired';
  if (nbf !== undefined && now + tolerance < nbf) return 'token_not_yet_valid';
  if (iat !== undefined && iat > now + tolerance) return 'token_issued_in_future';
  if (profile.maxTokenAge !== undefined) {
    if (iat === undefined) return 'claim_invalid';
    if (now - iat > profile.maxTokenAge + tolerance) return 'token_too_old';
  }
  if (profile.maxLifetime !== undefined) {
    const start = iat ?? nbf ?? now;
    if (exp - (start as number) > profile.maxLifetime) return 'lifetime_too_long';
  }

  const audiences = audienceList(payload[profile.audienceClaim]);
  if (audiences === undefined) return 'claim_invalid';
  if (!audiences.some((audience) => profile.audiences.includes(audience))) return 'audience_invalid';

  return checkConfirmation(payload.cnf, presented);
}
