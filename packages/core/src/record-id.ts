import { Buffer } from 'node:buffer';
import { hash } from 'node:crypto';

/**
 * Derives the store id of a record from the caller's scope, the operation and the client's key.
 *
 * Each part is length-prefixed before hashing, so no choice of characters in one part can make two
 * different triples collide (`a:b` + `c` versus `a` + `b:c`), and the result is 43 base64url
 * characters that are safe in any Redis key or SQL column: hostile keys can neither collide nor inject.
 *
 * @example
 * recordId('user:42', 'POST /charges', 'k-1'); // 'q3J...'
 */
export function recordId(scope: string, operation: string, key: string): string {
  // One string, one update: the same bytes as hashing each length prefix and part in turn.
  if (scope !== lastScope || operation !== lastOperation) {
    lastScope = scope;
    lastOperation = operation;
    lastPrefix = `${Buffer.byteLength(scope)}:${scope}${Buffer.byteLength(operation)}:${operation}`;
  }
  return hash('sha256', `${lastPrefix}${Buffer.byteLength(key)}:${key}`, 'base64url');
}

// The framed scope and operation of the last call: requests come in runs of one caller and one
// route, so this spares two length computations and a concatenation per record on most calls.
let lastScope = '';
let lastOperation = '';
let lastPrefix = '0:0:';
