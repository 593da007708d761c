import { Buffer } from 'node:buffer';
import { hash } from 'node:crypto';

/**
 * Derives the store id of a record from the caller's scope, the operation and the client's key.
 *
 * Each part is length-prefixed before hashing, so no choice of characters in one part can make two
 * different triples collide (`a:b` + `c` versus `a` + `b:c`), and the result is 43 base64url
 * characters that are safe in any Redis key or SQL column: hostile keys can neither collide nor inject.
 * A part holding a lone surrogate (a `sub` decoded from `"\ud800"`) has no UTF-8 form, and hashing
 * would turn each one into U+FFFD, so two such callers would share records: it is framed as its JSON
 * text instead, under a separator of its own, which keeps every part distinct.
 *
 * @example
 * recordId('user:42', 'POST /charges', 'k-1'); // 'q3J...'
 */
export function recordId(scope: string, operation: string, key: string): string {
  // One string, one update: the same bytes as hashing each length prefix and part in turn.
  if (scope !== lastScope || operation !== lastOperation) {
    lastScope = scope;
    lastOperation = operation;
    lastPrefix = `${frame(scope)}${frame(operation)}`;
  }
  return hash('sha256', `${lastPrefix}${frame(key)}`, 'base64url');
}

/**
 * One part of a hashed identity, length-prefixed so that no choice of characters makes two lists of
 * parts collide; a part with a lone surrogate is framed as its JSON text (see {@link recordId}).
 *
 * @example
 * frame('k-1'); // '3:k-1'
 */
export function frame(part: string): string {
  if ((part as WellFormedCheck).isWellFormed()) return `${Buffer.byteLength(part)}:${part}`;
  const json = JSON.stringify(part);
  return `${Buffer.byteLength(json)}!${json}`;
}

// String.prototype.isWellFormed (ES2024, Node 20+), which the ES2023 library types do not declare.
type WellFormedCheck = string & { isWellFormed(): boolean };

// The framed scope and operation of the last call: requests come in runs of one caller and one
// route, so this spares two length computations and a concatenation per record on most calls.
let lastScope = '';
let lastOperation = '';
let lastPrefix = '0:0:';
