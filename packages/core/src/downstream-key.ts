import { createHash } from 'node:crypto';
import { frame } from './record-id.js';

/** What {@link downstreamKey} derives from: a lease, or the two fields of one it reads. */
export interface DownstreamKeySource {
  /** The record id: the caller's scope, the operation and the client's key, hashed. */
  readonly id: string;
  /** The request's fingerprint. */
  readonly fingerprint: string;
}

/**
 * The idempotency key for a call this execution makes to another service (a payment API, another
 * idem service): a UUID (version 8, RFC 9562 section 5.8, from SHA-256) derived from the record id,
 * the request's fingerprint and `purpose`.
 *
 * Why derived and not random: the engine may run a request again, after a crash or a lost lease (the
 * lease ran out and a retry took the key over), or after the policy released the key. Each run sends
 * the downstream service the same key, so the downstream effect happens once, however often the
 * handler runs. Why from the record id and not the client's key: two callers may choose the same key;
 * the record id also holds the caller's scope and the operation, so their downstream keys differ.
 * The fingerprint makes a reuse of the key for other parameters after the retention ended (a new
 * logical operation) a new downstream key too. `purpose` names the call within the execution, so one
 * handler can make several (`'charge'`, `'email'`, `` `refund:${i}` ``).
 *
 * The key is a plain UUID, so services that ask for a UUID or bound the length (Stripe, 255
 * characters; many at 36 to 64) take it. It reveals nothing of the client's key or the body: it is a
 * hash, and only the record id, already a hash, goes in.
 *
 * @example
 * const started = await engine.begin({ scope, operation: 'POST /orders', key, fingerprint });
 * if (started.kind === 'execute') {
 *   await payments.charge(amount, { idempotencyKey: downstreamKey(started.lease, 'charge') });
 * }
 */
export function downstreamKey(source: DownstreamKeySource, purpose: string): string {
  if (typeof purpose !== 'string' || purpose === '') throw new TypeError('purpose must be a non-empty string');
  // Framed as the record id's parts are, so no choice of characters (lone surrogates included) makes
  // two different purposes collide.
  const framed = [domain, source.id, source.fingerprint, purpose].map(frame);
  const bytes = createHash('sha256').update(framed.join('')).digest();
  bytes[6] = ((bytes[6] as number) & 0x0f) | 0x80; // version 8
  bytes[8] = ((bytes[8] as number) & 0x3f) | 0x80; // variant 10 (RFC 9562)
  const hex = bytes.toString('hex', 0, 16);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

// Separates these hashes from every other SHA-256 idem computes over similar inputs.
const domain = 'idem downstream key v1';
