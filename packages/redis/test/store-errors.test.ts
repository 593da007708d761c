// Which Redis failures are "unavailable" (StoreUnavailableError: fail-open may open) and which are
// a Redis that answered the command is wrong here (RedisCommandError: fail-open stays closed), for
// the reply errors of both clients and the failures that are no reply at all.
import { inspect } from 'node:util';
import { createIdempotency, isStoreUnavailableError } from '@idem/core';
import { ReplyError } from 'ioredis';
import { ClientClosedError, ErrorReply, MultiErrorReply, SimpleError, SocketClosedUnexpectedlyError } from 'redis';
import { describe, expect, it } from 'vitest';
import { RecordFormatError, RedisCommandError, redisStore } from '../src/index.js';

const claimRejectsWith = (error: unknown) =>
  redisStore({ client: { send: () => Promise.reject(error) } })
    .claim({ id: 'id', token: 't', fingerprint: 'f', leaseMs: 1_000 })
    .catch((caught: unknown) => caught);

const replyClasses = [
  ['ioredis ReplyError', (message: string) => new ReplyError(message)],
  ['node-redis SimpleError', (message: string) => new SimpleError(message)],
  ['node-redis ErrorReply', (message: string) => new ErrorReply(message)],
] as const;

describe('Redis failures, told apart', () => {
  for (const [client, reply] of replyClasses) {
    it.each([
      'OOM command not allowed when used memory > maxmemory.',
      'LOADING Redis is loading the dataset in memory',
      'BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.',
      'MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to no.',
      "READONLY You can't write against a read only replica.",
      'UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)',
      'TRYAGAIN Multiple keys request during rehashing of slot',
      'CLUSTERDOWN The cluster is down',
      'NOREPLICAS Not enough good replicas to write.',
      'MISCONF Redis is configured to save RDB snapshots, but it is currently not able to persist on disk.',
    ])(`${client} %s: unavailable`, async (message) => {
      expect(isStoreUnavailableError(await claimRejectsWith(reply(message)))).toBe(true);
    });

    it.each([
      ['NOPERM', "NOPERM User u has no permissions to run the 'set' command"],
      ['WRONGTYPE', 'WRONGTYPE Operation against a key holding the wrong kind of value'],
      ['ERR', "ERR unknown command 'SETX', with args beginning with: 'idem:key' 'secret value' "],
      ['ERR', 'ERR user_script:1: Script attempted to access nonexistent global variable'],
      ['NOSCRIPT', 'NOSCRIPT No matching script. Please use EVAL.'],
      ['NOAUTH', 'NOAUTH Authentication required.'],
      ['CROSSSLOT', "CROSSSLOT Keys in request don't hash to the same slot"],
    ])(`${client} %s: answered, RedisCommandError`, async (code, message) => {
      const error = await claimRejectsWith(reply(message));
      expect(isStoreUnavailableError(error)).toBe(false);
      expect(error).toBeInstanceOf(RedisCommandError);
      expect(error).toMatchObject({ code: 'redis_command_refused', reply: code });
      expect((error as Error).message).toMatch(new RegExp(`^Redis claim was refused: ${code} `));
      expect((error as Error).message).not.toMatch(/secret|with args/);
    });
  }

  it("node-redis's MultiErrorReply (a pipeline's) is a reply too", async () => {
    const error = new MultiErrorReply([new SimpleError('NOPERM no')], [0]);
    expect(isStoreUnavailableError(await claimRejectsWith(error))).toBe(false);
  });

  it.each([
    ['ioredis, closed', new Error('Connection is closed.')],
    ['node-redis, closed', new ClientClosedError()],
    ['node-redis, socket', new SocketClosedUnexpectedlyError()],
    ['node, refused', Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' })],
    ['a custom runner, anything', new Error('NOPERM from a runner that raised no reply class')],
    ['not an Error', 'down'],
  ])('%s: unavailable', async (_name, error) => {
    expect(isStoreUnavailableError(await claimRejectsWith(error))).toBe(true);
  });
});

// A store that answered, whose answer the store cannot read: fail-open must stay closed on it, the
// error must be one a caller can match from the package, and none of the value may reach it.
describe('answers the store cannot read', () => {
  // SET NX finds the key taken; GET answers `held`.
  const heldBy = (held: unknown) =>
    redisStore({
      client: { send: async (_key, [command]) => (command === 'GET' ? held : null) },
    });
  const claim = (store: ReturnType<typeof redisStore>) =>
    store.claim({ id: 'id', token: 't', fingerprint: 'f', leaseMs: 1_000 }).catch((caught: unknown) => caught);

  it('a foreign value is a RecordFormatError exported by @idem/redis, with a stable code', async () => {
    const error = await claim(heldBy(Buffer.from('hello')));
    expect(error).toBeInstanceOf(RecordFormatError);
    expect(error).toMatchObject({ name: 'RecordFormatError', code: 'redis_record_format' });
  });

  it("a foreign value's text reaches neither the message nor the cause", async () => {
    // Starts as a record would; the rest is someone else's (a token, a header), not JSON.
    const error = await claim(heldBy(Buffer.from('csecret-token-41\n"fp"\n{"s":200}\n')));
    expect(error).toBeInstanceOf(RecordFormatError);
    expect(inspect(error, { depth: 10, showHidden: true }) + JSON.stringify(error)).not.toContain('secret');
    const completed = await claim(heldBy(Buffer.from('c"t"\n"f"\n{"s":200,"h":{"set-cookie":"sid=secret-42"\n')));
    expect(inspect(completed, { depth: 10, showHidden: true })).not.toContain('secret');
  });

  it('a reply of a type the store cannot read (a client mapping replies to strings) fails closed under fail-open', async () => {
    const store = heldBy('p"other"\n"f"\n');
    const error = await claim(store);
    expect(isStoreUnavailableError(error)).toBe(false);
    expect(error).toMatchObject({ name: 'UnexpectedReplyError', code: 'redis_unexpected_reply' });
    expect((error as Error).message).toBe('Redis claim returned an unexpected reply');
    const engine = createIdempotency({ store });
    const started = await engine.begin({
      key: 'k',
      scope: 'caller',
      operation: 'POST /charges',
      fingerprint: 'f',
      storeUnavailable: 'fail-open',
    });
    expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable', status: 503 } });
  });
});
