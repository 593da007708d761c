import {
  type AsyncStore,
  assertKnownOptions,
  assertStoreId,
  assertStoreString,
  type ClaimInput,
  type ClaimResult,
  type CompleteInput,
  type Duration,
  type ForgetInput,
  type ListsEvery,
  type ReleaseInput,
  type RenewInput,
  ResponseTooLargeError,
  responseLimit,
  type Store,
  StoreContendedError,
  type StoreRecord,
  StoreUnavailableError,
  toMilliseconds,
} from '@idem/core';
import { type RedisClientLike, redisCommandRunner } from './command-runner.js';
import { claimKeepMs, decodeRecord, encodeClaim, encodeOutcome, leasePrefix } from './record-codec.js';
import type { RedisCommandRunner } from './redis-command-runner.js';
import { integerReply, isOk } from './replies.js';
import { completeScript, forgetScript, inspectScript, releaseScript, renewScript, runScript } from './scripts.js';
import { toStoreError, UnexpectedReplyError } from './store-errors.js';

/**
 * Options of {@link redisStore}.
 *
 * @example
 * const options: RedisStoreOptions = { client: redis, prefix: 'billing:idem:', maxResponseBytes: 256 * 1024 };
 */
export interface RedisStoreOptions {
  /**
   * A connected client the caller owns: an ioredis `Redis` or `Cluster` (v5 or v6), a node-redis v5 or v6 client,
   * cluster or Sentinel client (`createSentinel`), or any {@link RedisCommandRunner}. The store never connects, quits or listens to it.
   *
   * Or a non-empty array of ioredis clients, all `Redis` (standalone or through Sentinel) or all
   * `Cluster`, each its own connection to the same deployment (same `keyPrefix`, same `db`): each
   * command, or write with its `WAIT`, goes to the one with the fewest of the store's commands in
   * flight. With `waitForReplicas`, a write held by its `WAIT` then holds one connection, not every
   * request (one ioredis client is one connection). Refused with a `TypeError`: an empty array, an
   * element that is no ioredis client, `Redis` mixed with `Cluster`, the same client twice, or clients
   * with a different `keyPrefix` or `db`. A node-redis `createClientPool` is given as one client.
   *
   * @example
   * import { Redis } from 'ioredis';
   *
   * const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
   * const clients = Array.from({ length: 8 }, () => new Redis(url)); // yours to close
   * const store = redisStore({ client: clients, waitForReplicas: { count: 1, timeout: '200ms' } });
   */
  client: RedisClientLike;
  /**
   * Prepended to every record id to form its Redis key. Default `'idem:'`. Use one prefix per
   * service (or environment) sharing a Redis. Avoid `{...}` in it on a cluster: a hash tag in the
   * prefix would put every record in one slot, on one node.
   */
  prefix?: string | undefined;
  /**
   * Largest encoded response (status, headers and body, as `storedResponseSize` measures it) that is
   * stored. A bigger one is refused with `ResponseTooLargeError` (the engine then releases the key);
   * the adapters read the cap from the store and settle such a response before they ask it (served,
   * not stored, and by default the key kept with `500 response_not_replayable`). Default 4 MiB.
   */
  maxResponseBytes?: number | undefined;
  /**
   * Follow every write the store answers as done (a claim, a renewal, a completion, a release, a
   * forget) with `WAIT count timeout` in the same pipeline, on the write's connection, and answer
   * `StoreUnavailableError` (503) when fewer than `count` replicas acknowledged it within `timeout`.
   * Replication is asynchronous: without it, a failover can drop outcomes that were answered 201, and
   * their retries run again without a word. Off by default: a standalone Redis has no replica, and
   * every write would be a 503. Against a planned failover set `count` to every replica; keep
   * `timeout` well below the engine's `storeTimeout`. See docs/stores.md, "Failover".
   */
  waitForReplicas?: ReplicaWait | undefined;
}

/**
 * Option `waitForReplicas` of {@link redisStore}.
 *
 * @example
 * const wait: ReplicaWait = { count: 2, timeout: '200ms' }; // both replicas of a Sentinel setup
 */
export interface ReplicaWait {
  /** How many replicas must have the write: a positive integer. */
  count: number;
  /** How long `WAIT` waits for them: more than 0 (`WAIT ... 0` would wait for ever). */
  timeout: Duration;
}

/**
 * A {@link Store} on Redis, with the key layout exposed for operators and tests.
 *
 * @example
 * const store = redisStore({ client: redis });
 * await redis.pttl(store.key(lease.id)); // the lease left, by the Redis clock
 */
export interface RedisStore extends AsyncStore {
  /** The key prefix in use. */
  readonly prefix: string;
  /** The Redis key that holds record `id`. */
  key(id: string): string;
  /** The largest response stored (option `maxResponseBytes`, 4 MiB by default). */
  readonly maxResponseBytes: number;
  /** Always there on this store: a Lua compare-and-delete on the token (see {@link Store.forget}). */
  forget(input: ForgetInput): Promise<boolean>;
}

// A key that is freed between our failed SET NX and our GET this many times in a row is flapping
// under an extraordinary storm of releases; give up with a retryable error instead of spinning.
const CLAIM_ATTEMPTS = 5;
// Redis refuses strings over 512 MB; leave room for the claim part of the value.
const REDIS_STRING_LIMIT = 512 * 1024 * 1024 - 64 * 1024;

const optionNames = [
  'client',
  'prefix',
  'maxResponseBytes',
  'waitForReplicas',
] as const satisfies readonly (keyof RedisStoreOptions)[];
const optionNamesAll: ListsEvery<RedisStoreOptions, typeof optionNames> = true;
void optionNamesAll;
const knownOptions: ReadonlySet<string> = new Set(optionNames);
const replicaWaitNames = ['count', 'timeout'] as const satisfies readonly (keyof ReplicaWait)[];
const replicaWaitNamesAll: ListsEvery<ReplicaWait, typeof replicaWaitNames> = true;
void replicaWaitNamesAll;

/**
 * Creates a {@link Store} on Redis. Every operation is one command on one key, so it is atomic and
 * runs unchanged on Redis Cluster:
 * - `claim` is `SET key value NX PX lease`, then `GET key` only when the key is taken (and a script
 *   that reads the value with its PTTL when that is a claim kept after its lease, to tell whether
 *   the lease has run out: a claim that takes an abandoned record over is that script too);
 * - `renew`, `complete`, `release` and `forget` are Lua compare-and-set on the fencing token
 *   (EVALSHA, with EVAL as the fallback on NOSCRIPT);
 * - leases and retention are `PX` durations, timed by the Redis server's clock;
 * - bodies are stored as raw bytes.
 *
 * A Redis that cannot be reached or cannot serve the command right now (refused, reset, timed out;
 * a reply such as `LOADING`, `READONLY`, `OOM`, `BUSY`, `CLUSTERDOWN`) rejects with
 * `StoreUnavailableError`: the engine answers 503, and `storeUnavailable: 'fail-open'` runs the
 * request unprotected. A Redis that answered the command is wrong here rejects with
 * `RedisCommandError` (`NOPERM`, `WRONGTYPE`, `ERR ...`), a value idem did not write under the
 * prefix with `RecordFormatError`, a reply the store cannot read (a custom runner over a client that
 * maps replies to strings) with `UnexpectedReplyError`, and a claim that kept racing with releases with
 * `StoreContendedError`: 503 at the claim too, but fail-open stays closed on them. Redis does not
 * bound how long a command waits while the client is disconnected: the engine's `storeTimeout` does.
 *
 * @example
 * import { Redis } from 'ioredis';
 * import { createIdempotency } from '@idem/core';
 * import { redisStore } from '@idem/redis';
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
 * const engine = createIdempotency({ store: redisStore({ client: redis, prefix: 'billing:idem:' }) });
 */
export function redisStore(options: RedisStoreOptions): RedisStore {
  if (!options || typeof options !== 'object') throw new TypeError('redisStore needs an options object');
  assertKnownOptions(options, knownOptions, 'redisStore');
  const runner = redisCommandRunner(options.client);
  const prefix = options.prefix ?? 'idem:';
  if (typeof prefix !== 'string') throw new TypeError('prefix must be a string');
  const maxResponseBytes = responseLimit(options.maxResponseBytes, REDIS_STRING_LIMIT, 'maxResponseBytes');
  // What sends the writes: the runner itself when waitForReplicas is off (nothing added per request),
  // or the runner behind a WAIT that fails the write unless enough replicas have it.
  const writer =
    options.waitForReplicas === undefined ? runner : waitingWriter(runner, replicaWait(options.waitForReplicas));

  // Every operation makes its key here first, so an id Redis could not keep apart from another (a
  // lone surrogate goes out as U+FFFD) is refused before any command, as every store refuses it
  // (see assertStoreString in @idem/core).
  const key = (id: string) => {
    assertStoreId(id, 'id');
    return prefix + id;
  };

  // A token is JSON in the value, where a lone surrogate or a NUL would survive (escaped); refused
  // anyway, so that no store accepts what another refuses.
  const fence = (token: string) => {
    assertStoreId(token, 'token');
    return leasePrefix(token);
  };

  // What goes wrong between us and Redis (refused, reset, timeout, a reply such as LOADING or
  // READONLY) is a store unavailable right now; a reply that says the command is wrong here (NOPERM,
  // WRONGTYPE, ERR) or a value idem did not write is a store that answered: see toStoreError.
  const guarded = async <T>(operation: string, work: () => Promise<T>): Promise<T> => {
    try {
      return await work();
    } catch (cause) {
      throw toStoreError(cause, operation);
    }
  };

  // The scripts answer the integer 1 or 0, which a client may hand back as a number, a string
  // (ioredis with stringNumbers) or bytes: see replies.ts.
  const flag = (operation: string, reply: unknown): boolean => {
    const answer = integerReply(reply);
    if (answer === 1) return true;
    if (answer === 0) return false;
    throw new UnexpectedReplyError(operation);
  };

  const bytes = (operation: string, reply: unknown): Uint8Array => {
    if (!(reply instanceof Uint8Array)) throw new UnexpectedReplyError(operation);
    return reply;
  };

  // A record as read by GET. A claim kept after its lease is read again with its PTTL, in one step,
  // to tell a live lease from an abandoned one: a rare read (a key in progress), so the common ones,
  // replays, stay one GET. Undefined when the key went away in between.
  const read = async (k: string, operation: string, value: Uint8Array): Promise<StoreRecord | undefined> => {
    const record = decodeRecord(value);
    if (record.state !== 'in_progress' || claimKeepMs(value) === 0) return record;
    return inspected(operation, await runScript(runner, inspectScript, k, ['', '', '0']));
  };

  // The answer of the inspect script other than 1: {value, PTTL}, or 0 for a key that is gone.
  const inspected = (operation: string, reply: unknown): StoreRecord | undefined => {
    if (integerReply(reply) === 0) return undefined;
    if (!Array.isArray(reply) || reply.length !== 2) throw new UnexpectedReplyError(operation);
    const pttl = integerReply(reply[1]);
    if (pttl === undefined) throw new UnexpectedReplyError(operation);
    return decodeRecord(bytes(operation, reply[0]), pttl);
  };

  // With waitForReplicas, a claim found already held by its own token: its SET (or takeover) ran on
  // a connection whose replies were lost, and was sent again on a new one, where it wrote nothing.
  // The WAIT behind that resend counts, by its contract, the new connection's writes alone (none),
  // so it proves nothing of the claim. A renewal to the same lease is a write after the claim's (on
  // whichever connection it leaves: the replication stream is one, in order), and a replica that
  // has it has the claim: its WAIT is the proof. Short of it,
  // the claim is freed by its token, as any claim too few replicas acknowledged.
  const replicated = async (k: string, token: string, leaseMs: number) => {
    let renewed: boolean;
    try {
      renewed = flag(
        'claim',
        await runScript(writer, renewScript, k, [leasePrefix(token), String(wholeMs(leaseMs, 'leaseMs'))]),
      );
    } catch (error) {
      await runScript(runner, releaseScript, k, [leasePrefix(token)]).catch(() => undefined);
      throw error;
    }
    if (!renewed) throw new StoreUnavailableError('Redis claim was lost before its replicas acknowledged it; retry');
  };

  return {
    prefix,
    key,
    maxResponseBytes,

    claim: async ({
      id,
      token,
      fingerprint,
      leaseMs,
      keepAfterLeaseMs,
      replaces,
    }: ClaimInput): Promise<ClaimResult> => {
      const k = key(id);
      assertStoreId(token, 'token');
      assertStoreString(fingerprint, 'fingerprint');
      const keepMs =
        keepAfterLeaseMs === undefined || keepAfterLeaseMs === 0 ? 0 : wholeMs(keepAfterLeaseMs, 'keepAfterLeaseMs');
      const value = encodeClaim(token, fingerprint, keepMs);
      const px = String(wholeMs(leaseMs, 'leaseMs') + keepMs);
      if (replaces !== undefined) assertStoreId(replaces, 'replaces');
      let takeover = replaces === undefined ? undefined : leasePrefix(replaces);
      return guarded('claim', async () => {
        // The fresh key, the common case, costs one plain SET NX PX: cheaper for Redis than a script.
        // A taken key costs a GET more. If the holder released (or its lease ran out) between the
        // two, the key is free again, so try the claim again rather than report a record that is gone.
        for (let attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
          let holder: StoreRecord | undefined;
          if (takeover !== undefined) {
            // A takeover of an abandoned record: replaced in one step if it still is that record.
            const reply = await runScript(writer, inspectScript, k, [takeover, value, px]);
            if (integerReply(reply) === 1) return { claimed: true };
            holder = inspected('claim', reply);
            // Not replaced: answered below, or, if the key is gone (its keep ended, or its holder
            // released it), claimed afresh with a plain SET NX on the next round.
            takeover = undefined;
          } else {
            let full: unknown;
            try {
              if (isOk(await writer.send(k, ['SET', k, value, 'NX', 'PX', px]))) return { claimed: true };
            } catch (error) {
              // A claim that too few replicas acknowledged is answered 503, and no handler runs for
              // it; left on the primary it would answer the client's retry 409 for a whole lease. Freed
              // by its token, alone (a WAIT behind the delete would fail the same way); if even that
              // fails, the lease runs out. So is one whose WAIT failed (Sentinel's switch answers a
              // waiting WAIT `UNBLOCKED`, an ACL may refuse it): the pipeline rejects with the WAIT's
              // error after its SET ran. Only OOM is the SET's own refusal; for any other error the
              // delete is fenced by the token, and changes nothing where the SET did not run. A
              // takeover is not freed: deleting it would drop the abandoned record it replaced, and
              // with it the 'abandoned' answer a retry should get.
              if (writer !== runner && !isOutOfMemory(error)) {
                await runScript(runner, releaseScript, k, [leasePrefix(token)]).catch(() => undefined);
                throw error;
              }
              // A full Redis (maxmemory, noeviction) refuses SET before it looks at the key, but still
              // serves GET: a retry of a stored request is answered from its record; only a free key,
              // which would need a write, is refused.
              if (!isOutOfMemory(error)) throw error;
              full = error;
            }
            const existing = await runner.send(k, ['GET', k]);
            if (existing === null || existing === undefined) {
              if (full !== undefined) throw full;
              continue;
            }
            holder = await read(k, 'claim', bytes('claim', existing));
          }
          if (holder === undefined) continue;
          // Our own token means our SET did run: its reply was lost, and the client sent the command
          // again after reconnecting (ioredis does by default), which then found the key taken by
          // us. Tokens are unique per claim, so nobody else can hold this one. Reported as taken,
          // the claim would answer 409 and leave the key held by nobody for a whole lease.
          if (holder.state === 'in_progress' && holder.token === token) {
            if (writer !== runner) await replicated(k, token, leaseMs);
            return { claimed: true };
          }
          return { claimed: false, record: holder };
        }
        // Redis answered every time: the key is live elsewhere, churning. Not "unavailable": under
        // fail-open that would run a duplicate beside its holder.
        throw new StoreContendedError('Redis claim kept racing with releases; retry');
      });
    },

    renew: async ({ id, token, leaseMs }: RenewInput): Promise<boolean> => {
      const k = key(id);
      const lease = fence(token);
      const px = milliseconds(leaseMs, 'leaseMs');
      return guarded('renew', async () => flag('renew', await runScript(writer, renewScript, k, [lease, px])));
    },

    complete: async ({ id, token, response, retentionMs }: CompleteInput): Promise<boolean> => {
      const k = key(id);
      const lease = fence(token);
      const px = milliseconds(retentionMs, 'retentionMs');
      // The engine checked the response's shape. Its size is the encoding's length (what
      // storedResponseSize counts), checked before anything is sent: an oversized response leaves the
      // claim as it was, and the engine releases it so a retry runs instead of waiting out the lease.
      const outcome = encodeOutcome(response);
      if (outcome.length > maxResponseBytes) throw new ResponseTooLargeError(outcome.length, maxResponseBytes);
      return guarded('complete', async () =>
        flag('complete', await runScript(writer, completeScript, k, [lease, outcome, px])),
      );
    },

    release: async ({ id, token }: ReleaseInput): Promise<boolean> => {
      const k = key(id);
      const lease = fence(token);
      return guarded('release', async () => flag('release', await runScript(writer, releaseScript, k, [lease])));
    },

    forget: async ({ id, token }: ForgetInput): Promise<boolean> => {
      const k = key(id);
      const lease = fence(token);
      return guarded('forget', async () => flag('forget', await runScript(writer, forgetScript, k, [lease])));
    },

    get: async (id: string): Promise<StoreRecord | undefined> => {
      const k = key(id);
      return guarded('get', async () => {
        const reply = await runner.send(k, ['GET', k]);
        return reply === null || reply === undefined ? undefined : read(k, 'get', bytes('get', reply));
      });
    },
  };
}

// Option waitForReplicas, checked once: a count WAIT takes, and its timeout in whole milliseconds.
const replicaWait = (value: ReplicaWait): { count: number; timeoutMs: number } => {
  if (value === null || typeof value !== 'object')
    throw new TypeError('waitForReplicas must be an object: { count, timeout }');
  assertKnownOptions(value, new Set(replicaWaitNames), 'waitForReplicas');
  const { count, timeout } = value;
  // Safe integers only: past 2^53 String() writes a number as '1e+21', which WAIT refuses, and
  // every write would be a 503 (each claim set and freed again) instead of a TypeError at startup.
  if (!Number.isSafeInteger(count) || count < 1) {
    throw new TypeError('waitForReplicas.count must be a positive integer');
  }
  if (timeout === undefined) throw new TypeError('waitForReplicas.timeout is required (WAIT with 0 waits for ever)');
  const timeoutMs = Math.ceil(toMilliseconds(timeout, 'waitForReplicas.timeout'));
  if (timeoutMs <= 0) throw new TypeError('waitForReplicas.timeout must be more than 0 (WAIT with 0 waits for ever)');
  if (!Number.isSafeInteger(timeoutMs)) {
    throw new TypeError('waitForReplicas.timeout must be at most 2^53 - 1 milliseconds');
  }
  return { count, timeoutMs };
};

/**
 * A runner for the store's writes that sends `WAIT count timeout` behind each one, in one pipeline.
 * WAIT answers how many replicas have every write its connection made so far, so it must leave on
 * the write's connection: sent on another one (a pool, a cluster's random node), it would count
 * replicas that never saw the write and prove nothing. Hence the pipeline, which also costs no round
 * trip more than the write itself: Redis runs the two back to back.
 *
 * Only a write that changed something is held to the count: `OK` from SET, 1 from a script (the
 * store answers it as done). A refused SET NX or a fenced script changed nothing, so its WAIT's
 * answer does not matter; failing it would turn the replay of a stored outcome into a 503 while a
 * replica is away.
 */
function waitingWriter(runner: RedisCommandRunner, { count, timeoutMs }: { count: number; timeoutMs: number }) {
  const { sendPipeline } = runner;
  if (typeof sendPipeline !== 'function') {
    throw new TypeError(
      'waitForReplicas needs a client that sends pipelines: an ioredis or node-redis client, or a RedisCommandRunner with sendPipeline',
    );
  }
  const wait = ['WAIT', String(count), String(timeoutMs)];
  return {
    send: async (key: string, args: readonly (string | Buffer)[]): Promise<unknown> => {
      const [reply, acknowledged] = await sendPipeline.call(runner, key, [args, wait]);
      if (!isOk(reply) && integerReply(reply) !== 1) return reply;
      const replicas = integerReply(acknowledged);
      if (replicas === undefined) throw new UnexpectedReplyError('WAIT');
      if (replicas < count) {
        throw new StoreUnavailableError(
          `Redis write not replicated: ${replicas} of ${count} replicas acknowledged it within ${timeoutMs} ms`,
        );
      }
      return reply;
    },
  } satisfies RedisCommandRunner;
}

// Redis's refusal of a write when it is over maxmemory with the noeviction policy.
const isOutOfMemory = (error: unknown): boolean => error instanceof Error && error.message.startsWith('OOM');

// PX takes a positive integer; a fraction rounds up so a lease is never shorter than asked for.
const wholeMs = (value: number, name: string): number => {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new TypeError(`${name} must be a positive number of milliseconds`);
  }
  return Math.ceil(value);
};

// The same, as the PX argument.
const milliseconds = (value: number, name: string): string => String(wholeMs(value, name));
