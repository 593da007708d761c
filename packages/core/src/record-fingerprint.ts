import { createHash } from 'node:crypto';
import { fingerprintsMatch } from './fingerprint.js';

/**
 * The fingerprint as every store keeps it: a SHA-256 digest in hex (what the adapters and the webhook
 * receiver pass) as given, anything else as `sha256:` and the hex SHA-256 of its JSON text. Never
 * the text itself: a caller that passes the request (`JSON.stringify(body)`, the natural first try)
 * would have the body kept in every store for the lease and a whole retention, at any length, though
 * the record is documented to hold a SHA-256 and no request body. Hashing also makes every
 * fingerprint mean the same on every store: PostgreSQL cannot hold a NUL in text and turns a lone
 * surrogate into U+FFFD (JSON text keeps lone surrogates apart). `''` stays: it means "no fingerprint".
 */
export function storableFingerprint(fingerprint: string | undefined): string {
  if (fingerprint === undefined) return '';
  if (typeof fingerprint !== 'string') throw new TypeError('begin needs a string fingerprint, or none');
  return fingerprint === '' || hexDigest.test(fingerprint)
    ? fingerprint
    : `sha256:${createHash('sha256').update(JSON.stringify(fingerprint)).digest('hex')}`;
}

const hexDigest = /^(?:sha256:)?[0-9a-f]{64}$/;

/**
 * A request's fingerprints under earlier settings (`alternateFingerprints`), asked for once and only
 * when a record's fingerprint is not the request's own: a mismatch is rare, so the common path never
 * computes them (and a begin without them allocates nothing for them).
 */
export class Alternates {
  private list: readonly string[] | undefined = undefined;

  constructor(private readonly ask: () => readonly string[] | undefined) {}

  /** True when `stored` is one of them. */
  has(stored: string): boolean {
    this.list ??= (this.ask() ?? []).map(storableFingerprint);
    // An empty alternate means "no fingerprint", which would match anything: never a match here.
    return this.list.some((other) => other !== '' && fingerprintsMatch(stored, other));
  }
}

/** True when a record's fingerprint is of this request: its own, or one of its alternates. */
export function sameRequest(stored: string, fingerprint: string, alternates: Alternates | undefined): boolean {
  return fingerprintsMatch(stored, fingerprint) || alternates?.has(stored) === true;
}

/**
 * The fingerprint a takeover of an abandoned record (one of this request) writes: the record's own,
 * unless it has none. A request without a fingerprint keeps the record's, or the record would then
 * replay to any parameters and the crashed attempt's be refused no more; a request that matched it
 * only under earlier settings keeps it too, so instances still on those settings (a rolling deploy)
 * match the outcome, and records are never rewritten to the new settings.
 */
export function keptFingerprint(fingerprint: string, stored: string): string {
  return stored === '' ? fingerprint : stored;
}
