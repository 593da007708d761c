/*
 * Reading Redis replies whatever the client made of them. RESP says what a reply is; each client
 * decides what JavaScript value it becomes, and some let their caller change that:
 * - ioredis with `stringNumbers: true` hands back integer replies as strings ('1'), in buffer mode too;
 * - a node-redis `typeMapping`, or a RedisCommandRunner of one's own, may give a number, a bigint,
 *   a string or bytes.
 * A script that ran and answered 1 must count as 1 in every one of these forms. Reading one of them
 * as "unexpected" would reject a renewal or a completion that Redis did carry out (a false 503, a
 * stored outcome reported as a store error).
 */

const decoder = new TextDecoder();

/**
 * The integer of a RESP integer reply, in any of the forms a client gives it, or `undefined` when
 * `reply` is not an integer reply.
 *
 * @example
 * integerReply(1); // 1
 * integerReply('1'); // 1 (ioredis with stringNumbers: true)
 * integerReply(Buffer.from('0')); // 0
 * integerReply('OK'); // undefined
 */
export function integerReply(reply: unknown): number | undefined {
  if (typeof reply === 'number') return Number.isInteger(reply) ? reply : undefined;
  if (typeof reply === 'bigint') return Number(reply);
  const text = typeof reply === 'string' ? reply : reply instanceof Uint8Array ? decoder.decode(reply) : undefined;
  // The decimal form RESP itself uses: an optional minus and digits, nothing around them.
  return text !== undefined && /^-?\d{1,15}$/.test(text) ? Number(text) : undefined;
}

/**
 * True for the `OK` status reply of a successful `SET`: ioredis gives it as a Buffer in buffer mode,
 * node-redis as a string. A `SET NX` that found the key taken answers nil instead.
 *
 * @example
 * isOk(Buffer.from('OK')); // true
 * isOk(null); // false
 */
export function isOk(reply: unknown): boolean {
  return (
    reply === 'OK' || (reply instanceof Uint8Array && reply.length === 2 && reply[0] === 0x4f && reply[1] === 0x4b)
  );
}
