import { isStoreContendedError, isStoreUnavailableError, StoreUnavailableError } from '@idem/core';
import { RecordFormatError } from './record-codec.js';

/**
 * Redis answered a command of the store with an error that says the command is wrong here, not that
 * Redis cannot serve it right now: an ACL that denies it (`NOPERM`), someone else's key of another
 * type under the prefix (`WRONGTYPE`), a command or script Redis refuses (`ERR ...`, `NOSCRIPT`).
 * Every retry meets it again, so it is no {@link StoreUnavailableError}: under
 * `storeUnavailable: 'fail-open'` the request fails closed (503 at the claim, as any claim error),
 * rather than every request running unprotected for as long as the misconfiguration lasts.
 *
 * `reply` is the error code Redis sent (the reply's first word). The message names the operation
 * and quotes Redis's reply without the arguments Redis echoes for an unknown command; there is no
 * `cause`: the client's error carries those arguments in its message and stack.
 *
 * @example
 * store.claim(input).catch((error) => { if (error.code === 'redis_command_refused') alert(error.reply); });
 */
export class RedisCommandError extends Error {
  override readonly name = 'RedisCommandError' as const;
  readonly code = 'redis_command_refused' as const;
  readonly reply: string;
  constructor(operation: string, reply: string, text: string) {
    super(`Redis ${operation} was refused: ${text}`);
    this.reply = reply;
  }
}

/**
 * Redis answered a command of the store with a reply the store cannot read: bytes where a number
 * belongs, text where bytes do. A client that maps replies to other types (a `RedisCommandRunner`
 * over a client with a string type mapping) gives it on every command, so, like
 * {@link RedisCommandError}, it is no {@link StoreUnavailableError}: under
 * `storeUnavailable: 'fail-open'` the request fails closed rather than every request running
 * unprotected for as long as the misconfiguration lasts. The message names the operation only.
 *
 * @example
 * store.claim(input).catch((error) => { if (error.code === 'redis_unexpected_reply') alert(error.message); });
 */
export class UnexpectedReplyError extends Error {
  override readonly name = 'UnexpectedReplyError' as const;
  readonly code = 'redis_unexpected_reply' as const;
  constructor(operation: string) {
    super(`Redis ${operation} returned an unexpected reply`);
  }
}

// Reply error codes that say "Redis is up but cannot serve this right now", as PostgreSQL's
// transient SQLSTATEs do (see @idem/postgres's unavailable.ts): over maxmemory (OOM; PostgreSQL's
// class 53), a dataset loading after a restart (LOADING), a script running too long (BUSY), a
// replica cut off from its primary (MASTERDOWN), a write sent to a replica after a failover
// (READONLY; PostgreSQL's 25006) or a WAIT unblocked by one (UNBLOCKED), a cluster resharding or
// down (TRYAGAIN, CLUSTERDOWN), too few replicas for min-replicas-to-write (NOREPLICAS), and
// snapshots failing on a full or broken disk (MISCONF).
const transientReplies = new Set([
  'OOM',
  'LOADING',
  'BUSY',
  'MASTERDOWN',
  'READONLY',
  'UNBLOCKED',
  'TRYAGAIN',
  'CLUSTERDOWN',
  'NOREPLICAS',
  'MISCONF',
]);

// The classes the clients raise an error reply with: ioredis's ReplyError (redis-errors), node-redis's
// ErrorReply and its subclasses (SimpleError, BlobError, MultiErrorReply). By class name, up the
// prototype chain: node-redis does not set `name`, and neither client is imported here.
const replyClasses = new Set(['ReplyError', 'ErrorReply']);

const isReply = (error: Error): boolean => {
  for (let proto = Object.getPrototypeOf(error); proto !== null && proto !== Error.prototype; ) {
    if (replyClasses.has(proto.constructor?.name)) return true;
    proto = Object.getPrototypeOf(proto);
  }
  return false;
};

// Redis quotes the first arguments of a command it does not know ("ERR unknown command 'X', with
// args beginning with: 'key' 'value' "): the store's keys, tokens and bodies. Cut there.
const replyText = (message: string): string => message.split(/, with args beginning with:/)[0]?.trim() ?? '';

/**
 * What a failed Redis operation rejects with: the store's own errors (a claim that kept racing,
 * `StoreContendedError`), a value idem did not write (`RecordFormatError`: someone else's key
 * under the prefix) and a reply it cannot read (`UnexpectedReplyError`) as they are, a reply that says the
 * command is wrong here as a {@link RedisCommandError}, and everything else (refused, reset, timed
 * out, a transient reply) as a {@link StoreUnavailableError}, trimmed of the command's values.
 *
 * @example
 * await runner.send(key, args).catch((error) => { throw toStoreError(error, 'claim'); });
 */
export function toStoreError(error: unknown, operation: string): Error {
  if (
    isStoreUnavailableError(error) ||
    isStoreContendedError(error) ||
    error instanceof RedisCommandError ||
    error instanceof UnexpectedReplyError ||
    error instanceof RecordFormatError
  )
    return error;
  if (error instanceof Error && isReply(error)) {
    const reply = /^[A-Z][A-Z0-9_-]*/.exec(error.message)?.[0] ?? '';
    if (!transientReplies.has(reply)) return new RedisCommandError(operation, reply, replyText(error.message));
  }
  // Trimmed of the command's values by StoreUnavailableError itself.
  return new StoreUnavailableError(`Redis ${operation} failed`, { cause: error });
}
