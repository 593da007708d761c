import { describe, expect, it } from 'vitest';
import { type RedisClientLike, type RedisCommandRunner, redisCommandRunner, redisStore } from '../src/index.js';

describe('redisCommandRunner', () => {
  it('passes a RedisCommandRunner through unchanged', () => {
    const runner: RedisCommandRunner = { send: async () => null };
    expect(redisCommandRunner(runner)).toBe(runner);
  });

  it('passes a RedisCommandRunner through unchanged when it is a function with a send method', () => {
    // A runner may be a function object (a bound client method, a proxy): its send is what counts.
    const runner = Object.assign(() => undefined, { send: async () => null }) as RedisCommandRunner;
    expect(redisCommandRunner(runner)).toBe(runner);
  });

  // Was wrong: a node-redis Sentinel client (createSentinel) was taken for a plain client, and its
  // sendCommand(isReadonly, args, options) got the command as isReadonly and the options as the
  // command: every call failed with "ERR Protocol error". failover.int.test.ts runs it on real Sentinels.
  it('sends through a node-redis Sentinel client to the primary (isReadonly false), with buffers', async () => {
    const calls: unknown[][] = [];
    const sentinel = {
      sendCommand: async (...args: unknown[]) => {
        calls.push(args);
        return null;
      },
      getMasterNode: () => ({ host: '127.0.0.1', port: 6379 }),
    };
    await redisCommandRunner(sentinel as unknown as RedisClientLike).send('k', ['GET', 'k']);
    expect(calls).toEqual([[false, ['GET', 'k'], { typeMapping: { 36: Buffer } }]]);
  });

  it.each([
    ['null', null],
    ['a string', 'redis://127.0.0.1'],
    ['an object without a command method', { connect() {} }],
  ])('refuses %s with a TypeError', (_, client) => {
    expect(() => redisCommandRunner(client as unknown as RedisClientLike)).toThrow(TypeError);
    expect(() => redisStore({ client: client as unknown as RedisClientLike })).toThrow(TypeError);
  });

  it('redisStore refuses a misspelt option instead of using its default', () => {
    const runner: RedisCommandRunner = { send: async () => null };
    expect(() => redisStore({ client: runner, keyPrefix: 'app:' } as never)).toThrow(
      'redisStore: unknown option "keyPrefix"',
    );
  });
});
