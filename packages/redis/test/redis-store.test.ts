import { StoreUnavailableError } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { type RedisCommandRunner, redisStore } from '../src/index.js';

// These checks happen before any command is sent: a runner that only records is enough, and a test
// that finds something in `sent` has caught a command that should never have left.
const recorder = () => {
  const sent: string[][] = [];
  const runner: RedisCommandRunner = {
    send: async (_key, args) => {
      sent.push(args.map(String));
      return null;
    },
  };
  return { runner, sent };
};

// What the store takes as its ceiling for maxResponseBytes: Redis refuses strings over 512 MiB, and
// the claim's token and fingerprint come before the response in the same string.
const ceiling = 512 * 1024 * 1024 - 64 * 1024;

describe('redisStore options', () => {
  it("puts records under 'idem:' by default", () => {
    const store = redisStore({ client: recorder().runner });
    expect(store.prefix).toBe('idem:');
    expect(store.key('abc')).toBe('idem:abc');
  });

  it('keeps an empty prefix as given: a Redis used by idem alone needs none', () => {
    const store = redisStore({ client: recorder().runner, prefix: '' });
    expect(store.prefix).toBe('');
    // Declared, so the HTTP layer knows in advance what it would refuse (4 MiB by default).
    expect(store.maxResponseBytes).toBe(4 * 1024 * 1024);
    expect(store.key('abc')).toBe('abc');
  });

  it('accepts a maxResponseBytes up to 512 MiB less 64 KiB, and refuses one byte more', () => {
    const { runner } = recorder();
    expect(redisStore({ client: runner, maxResponseBytes: ceiling }).maxResponseBytes).toBe(ceiling);
    expect(() => redisStore({ client: runner, maxResponseBytes: ceiling + 1 })).toThrow(TypeError);
  });
});

describe('redisStore record ids', () => {
  it('refuses an empty or non-string id with a TypeError, and sends nothing', async () => {
    const { runner, sent } = recorder();
    const store = redisStore({ client: runner });
    // An empty id would make the prefix itself a record key; a number would be coerced into one.
    for (const id of ['', 42 as unknown as string]) {
      expect(() => store.key(id)).toThrow(TypeError);
      await expect(store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 })).rejects.toThrow(TypeError);
      await expect(store.get(id)).rejects.toThrow(TypeError);
    }
    expect(sent).toEqual([]);
  });
});

describe('redisStore failures', () => {
  it('keeps what the runner rejected with as the cause of a script failure, even a value that is no Error', async () => {
    // The store looks at the rejection to tell NOSCRIPT apart; a thrown string must not turn into a
    // TypeError of that check, which would hide what the runner reported.
    const runner: RedisCommandRunner = { send: () => Promise.reject('connection lost') };
    const store = redisStore({ client: runner });
    for (const attempt of [
      () => store.renew({ id: 'a', token: 't', leaseMs: 1_000 }),
      () => store.release({ id: 'a', token: 't' }),
      () => store.forget({ id: 'a', token: 't' }),
      () =>
        store.complete({
          id: 'a',
          token: 't',
          response: { status: 200, headers: {}, body: new Uint8Array() },
          retentionMs: 1_000,
        }),
    ]) {
      const error = await attempt().catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(StoreUnavailableError);
      expect((error as StoreUnavailableError).cause).toBe('connection lost');
    }
  });
});
