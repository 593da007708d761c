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

  // Pipelines carry the store's waitForReplicas: a write and its WAIT on one connection. node-redis
  // rejects a pipeline with a MultiErrorReply that holds every reply; the store needs the first error
  // itself, to tell NOSCRIPT (send EVAL) from a failure.
  it('pipelines through a node-redis cluster to the key, and rejects with the first error reply', async () => {
    const noScript = new Error('NOSCRIPT No matching script');
    const added: unknown[][] = [];
    const multi = {
      addCommand: (...args: unknown[]) => {
        added.push(args);
        return multi;
      },
      execAsPipeline: () =>
        Promise.reject(Object.assign(new Error('1 commands failed'), { replies: [noScript, 0], errorIndexes: [0] })),
    };
    const mappings: unknown[] = [];
    const routed: unknown[] = [];
    const cluster = {
      sendCommand: async () => null,
      masters: [],
      withTypeMapping: (mapping: unknown) => {
        mappings.push(mapping);
        return {
          multi: (key: unknown) => {
            routed.push(key);
            return multi;
          },
        };
      },
    };
    const runner = redisCommandRunner(cluster as unknown as RedisClientLike);
    const sent = runner.sendPipeline?.('k', [
      ['EVALSHA', 'sha', '1', 'k'],
      ['WAIT', '1', '100'],
    ]);
    await expect(sent).rejects.toBe(noScript);
    expect(mappings).toEqual([{ 36: Buffer }]);
    expect(routed).toEqual(['k']);
    expect(added).toEqual([
      ['k', false, ['EVALSHA', 'sha', '1', 'k']],
      ['k', false, ['WAIT', '1', '100']],
    ]);
  });

  it('gives a runner of its own no sendPipeline it lacks, and a client without pipelines none', () => {
    expect(redisCommandRunner({ send: async () => null }).sendPipeline).toBeUndefined();
    expect(redisCommandRunner({ callBuffer: async () => null }).sendPipeline).toBeUndefined();
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
