/**
 * Throws a `TypeError` unless `value` is a string that every store keeps as it is: well-formed
 * UTF-16 (`String.prototype.isWellFormed`) with no U+0000. `name` says which argument it is
 * (`id`, `token`, `fingerprint`, `replaces`); the message never carries the value (an id or a
 * token is no one's to log).
 *
 * Why these two: a lone surrogate (`'\ud800'`) has no UTF-8 form, and node-postgres and ioredis
 * send it as U+FFFD, so `'a\ud800'` and `'a\udc00'` were one record (or one fencing token) in
 * PostgreSQL and Redis while the memory store kept them apart: two callers met on one record, or a
 * stale holder passed the fence. PostgreSQL `text` cannot hold U+0000 at all (SQLSTATE 22021, a
 * raw driver error the engine would answer 503). So every store refuses both, the same way, before
 * any I/O: a store swap never changes which strings are accepted. The engine never trips it (its ids
 * are SHA-256 base64url digests, its tokens random base64url with a counter, its fingerprints hex digests); only a direct caller can.
 *
 * Header values and reason phrases are not checked here: `assertStoredResponse`, which the engine
 * runs on every response before a store sees it, admits only HTTP field-value characters (no
 * U+0000, nothing above U+00FF, so no surrogate).
 *
 * The cost is a scan of the string twice, in native code: about 20 ns for a 43-character id.
 *
 * @example
 * assertStoreString(input.id, 'id'); // a store's first line, before any I/O
 * assertStoreString('a\ud800', 'id'); // throws TypeError: id must be well-formed UTF-16 without U+0000 ...
 */
export function assertStoreString(value: unknown, name: string): asserts value is string {
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string`);
  if (!(value as WellFormedCheck).isWellFormed() || value.includes('\0')) {
    throw new TypeError(
      `${name} must be well-formed UTF-16 without U+0000 (no lone surrogate, no NUL): a store could not keep it apart from another string`,
    );
  }
}

// String.prototype.isWellFormed (ES2024, Node 20+), which the ES2023 library types do not declare.
type WellFormedCheck = string & { isWellFormed(): boolean };

/**
 * {@link assertStoreString}, and not empty: what an id, a token or `replaces` must be. An empty id
 * would be one record for every caller that gives none, an empty token a fence any caller passes
 * without holding a claim; an empty fingerprint is a fingerprint (a caller that compares none), so
 * fingerprints are checked with assertStoreString alone.
 *
 * @example
 * assertStoreId(input.token, 'token');
 * assertStoreId('', 'id'); // throws TypeError: id must be a non-empty string
 */
export function assertStoreId(value: unknown, name: string): asserts value is string {
  assertStoreString(value, name);
  if (value.length === 0) throw new TypeError(`${name} must be a non-empty string`);
}
