import type { StoredResponse, StoreRecord } from '@idem/core';

/*
 * One Redis string per record, binary safe, laid out so that the Lua scripts never parse anything:
 *
 *   in progress:  'p' <token as JSON> '\n' <fingerprint as JSON> '\n' [<keepAfterLeaseMs in decimal> '\n']
 *   completed:    'c' <token as JSON> '\n' <fingerprint as JSON> '\n' <{"s":status,"h":headers[,"m":reason]} as JSON> '\n' <raw body bytes>
 *
 * A claim kept after its lease (`keepAfterLeaseMs` > 0) lives for its lease plus that keep (`PX`),
 * and says how long the keep is: its lease has run out, and the record is abandoned, once the key's
 * PTTL is at most the keep. Without a keep the claim is written exactly as before the keep existed,
 * and completing a claim drops the keep line, so completed records never changed: a version that
 * predates the keep reads them, and only such a claim of a newer version is a value it cannot read.
 *
 * `"m"`, the handler's own reason phrase, is there only when it set one: a record without it is byte for
 * byte what versions before it wrote, and one with it is read by them too (they never look for it),
 * replayed with the default phrase.
 *
 * JSON never contains a raw 0x0A byte (JSON.stringify escapes every control character, and UTF-8
 * continuation bytes are all >= 0x80), so the first three newlines are always separators, and the
 * body after the third one is the response's bytes exactly as they were, with no base64 inflation.
 *
 * The compare-and-set scripts check that the value starts with 'p' + token + '\n' (see
 * {@link leasePrefix}): a byte comparison of a prefix. Completing replaces the leading 'p' with 'c'
 * and appends the response, which carries the claim's fingerprint over without Lua ever decoding it.
 */

const NEWLINE = 0x0a;
const IN_PROGRESS = 0x70; // 'p'
const COMPLETED = 0x63; // 'c'

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

/**
 * Thrown by {@link decodeRecord} for a value idem did not write (another app's key, or corruption).
 * The store rejects with it as it is: a store that answered, not one unavailable (see store-errors.ts).
 *
 * @example
 * decodeRecord(Buffer.from('hello')); // throws RecordFormatError
 */
export class RecordFormatError extends Error {
  override readonly name = 'RecordFormatError' as const;
  readonly code = 'redis_record_format' as const;
}

/**
 * The bytes every in-progress value held by `token` starts with. The scripts compare this prefix to
 * fence stale holders: a different token, or a completed record, never matches.
 *
 * @example
 * leasePrefix('t1'); // Buffer of 'p"t1"\n'
 */
export function leasePrefix(token: string): Buffer {
  return Buffer.from(`p${JSON.stringify(token)}\n`, 'utf8');
}

/**
 * Encodes a fresh claim: the value `SET NX PX` writes, with the keep after its lease in whole
 * milliseconds (0: none, and no line for it). Throws a `TypeError` for a token or fingerprint that is
 * not a string, or a keep that is not a whole number of milliseconds, 0 or more.
 *
 * @example
 * encodeClaim('t1', 'fp'); // Buffer of 'p"t1"\n"fp"\n'
 * encodeClaim('t1', 'fp', 86_400_000); // Buffer of 'p"t1"\n"fp"\n86400000\n'
 */
export function encodeClaim(token: string, fingerprint: string, keepMs = 0): Buffer {
  // Anything else would be written as something decodeRecord refuses: a claim nobody can read.
  if (typeof token !== 'string' || typeof fingerprint !== 'string') {
    throw new TypeError('token and fingerprint must be strings');
  }
  if (!Number.isSafeInteger(keepMs) || keepMs < 0) throw new TypeError('keepMs must be a whole number, 0 or more');
  const keep = keepMs > 0 ? `${keepMs}\n` : '';
  return Buffer.from(`p${JSON.stringify(token)}\n${JSON.stringify(fingerprint)}\n${keep}`, 'utf8');
}

/**
 * Encodes what the completion script appends to the claim: status and headers, then the raw body.
 * Its length is `storedResponseSize(response)` from @idem/core, so the store checks its size cap
 * against this encoding, with no second serialisation of the headers.
 *
 * @example
 * encodeOutcome({ status: 201, headers: {}, body: new Uint8Array([1]) }).length; // 18
 */
export function encodeOutcome(response: StoredResponse): Buffer {
  const { status: s, headers: h, statusMessage: m } = response;
  const meta = encoder.encode(`${JSON.stringify(m === undefined ? { s, h } : { s, h, m })}\n`);
  const out = Buffer.allocUnsafe(meta.length + response.body.length);
  out.set(meta, 0);
  out.set(response.body, meta.length);
  return out;
}

/**
 * Decodes a record value read from Redis. A claim with a keep is `abandoned` when `pttl`, the key's
 * PTTL read with it, is at most its keep (its lease has run out); without `pttl` it is taken as in
 * progress. Throws {@link RecordFormatError} for bytes idem did not write.
 *
 * @example
 * decodeRecord(encodeClaim('t1', 'fp')); // { state: 'in_progress', token: 't1', fingerprint: 'fp' }
 * decodeRecord(encodeClaim('t1', 'fp', 60_000), 59_000); // { state: 'abandoned', ... }
 */
export function decodeRecord(value: Uint8Array, pttl?: number): StoreRecord {
  const state = value[0];
  if (state !== IN_PROGRESS && state !== COMPLETED) throw new RecordFormatError('not an idem record');
  const tokenEnd = value.indexOf(NEWLINE, 1);
  const fingerprintEnd = tokenEnd < 0 ? -1 : value.indexOf(NEWLINE, tokenEnd + 1);
  if (fingerprintEnd < 0) throw new RecordFormatError('truncated idem record');
  const token = parseString(value.subarray(1, tokenEnd));
  const fingerprint = parseString(value.subarray(tokenEnd + 1, fingerprintEnd));
  if (state === IN_PROGRESS) {
    const keepMs = keepLine(value, fingerprintEnd);
    const abandoned = keepMs > 0 && pttl !== undefined && pttl >= 0 && pttl <= keepMs;
    return { state: abandoned ? 'abandoned' : 'in_progress', token, fingerprint };
  }
  const metaEnd = value.indexOf(NEWLINE, fingerprintEnd + 1);
  if (metaEnd < 0) throw new RecordFormatError('truncated idem record');
  const meta = parseJson(value.subarray(fingerprintEnd + 1, metaEnd)) as { s?: unknown; h?: unknown; m?: unknown };
  if (!meta || typeof meta !== 'object' || typeof meta.s !== 'number' || !isHeaders(meta.h)) {
    throw new RecordFormatError('malformed idem response');
  }
  if (meta.m !== undefined && typeof meta.m !== 'string') throw new RecordFormatError('malformed idem response');
  // A copy, not a view: the client may hand out slices of a reused socket buffer, and a caller may
  // keep the body long after this reply.
  const body = new Uint8Array(value.subarray(metaEnd + 1));
  const response: StoredResponse = { status: meta.s, headers: meta.h, body };
  if (meta.m !== undefined) response.statusMessage = meta.m;
  return { state: 'completed', token, fingerprint, response };
}

/**
 * The keep after its lease of an in-progress value (see {@link encodeClaim}), 0 when it has none.
 * Throws {@link RecordFormatError} for anything but a claim idem wrote.
 *
 * @example
 * claimKeepMs(encodeClaim('t1', 'fp', 60_000)); // 60000
 */
export function claimKeepMs(value: Uint8Array): number {
  if (value[0] !== IN_PROGRESS) throw new RecordFormatError('not an idem claim');
  const tokenEnd = value.indexOf(NEWLINE, 1);
  const fingerprintEnd = tokenEnd < 0 ? -1 : value.indexOf(NEWLINE, tokenEnd + 1);
  if (fingerprintEnd < 0) throw new RecordFormatError('truncated idem record');
  return keepLine(value, fingerprintEnd);
}

// The optional keep line after a claim's fingerprint: digits and a newline, ending the value.
const keepLine = (value: Uint8Array, fingerprintEnd: number): number => {
  if (fingerprintEnd === value.length - 1) return 0;
  const line = value.subarray(fingerprintEnd + 1);
  const digits = Buffer.from(line.subarray(0, line.length - 1)).toString('latin1');
  if (line[line.length - 1] !== NEWLINE || !/^[1-9][0-9]{0,15}$/.test(digits)) {
    throw new RecordFormatError('trailing bytes after an idem claim');
  }
  return Number(digits);
};

// No `cause`: JSON.parse's SyntaxError quotes the text it failed on (a token, a fingerprint, a
// response's headers, or someone else's value), and the error goes on to store-error events and logs.
const parseJson = (bytes: Uint8Array): unknown => {
  try {
    return JSON.parse(decoder.decode(bytes));
  } catch {
    throw new RecordFormatError('malformed idem record');
  }
};

const parseString = (bytes: Uint8Array): string => {
  const parsed = parseJson(bytes);
  if (typeof parsed !== 'string') throw new RecordFormatError('malformed idem record');
  return parsed;
};

const isHeaders = (value: unknown): value is Record<string, string> =>
  typeof value === 'object' &&
  value !== null &&
  !Array.isArray(value) &&
  Object.values(value).every((header) => typeof header === 'string');
