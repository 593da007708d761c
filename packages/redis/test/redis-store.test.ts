import { StoreUnavailableError } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { type RedisCommandRunner, redisStore } from '../src/index.js';
import { encodeClaim } from '../src/record-codec.js';

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

  // A lone surrogate goes out as U+FFFD: 'a\ud800' and 'a\udc00' were one key, two callers one
  // record. Refused as every store refuses it (a TypeError, misuse), never sent, and never wrapped
  // as StoreUnavailableError (a 503 that a retry would meet again).
  it('refuses an id, token, fingerprint or replaces holding U+0000 or a lone surrogate with a TypeError, and sends nothing', async () => {
    const { runner, sent } = recorder();
    const store = redisStore({ client: runner });
    const refused = async (call: () => Promise<unknown>) => {
      const error = await call().then(
        () => undefined,
        (thrown: unknown) => thrown,
      );
      expect(error).toBeInstanceOf(TypeError);
      expect(error).not.toBeInstanceOf(StoreUnavailableError);
    };
    const response = { status: 201, headers: {}, body: new Uint8Array(0) };
    for (const bad of ['a\u0000', 'a\ud800', 'a\udc00']) {
      expect(() => store.key(bad)).toThrow(TypeError);
      await refused(() => store.claim({ id: bad, token: 't', fingerprint: '', leaseMs: 1_000 }));
      await refused(() => store.claim({ id: 'k', token: bad, fingerprint: '', leaseMs: 1_000 }));
      await refused(() => store.claim({ id: 'k', token: 't', fingerprint: bad, leaseMs: 1_000 }));
      await refused(() => store.claim({ id: 'k', token: 't', fingerprint: '', leaseMs: 1_000, replaces: bad }));
      await refused(() => store.get(bad));
      for (const input of [
        { id: bad, token: 't' },
        { id: 'k', token: bad },
      ]) {
        await refused(() => store.renew({ ...input, leaseMs: 1_000 }));
        await refused(() => store.complete({ ...input, response, retentionMs: 1_000 }));
        await refused(() => store.release(input));
        await refused(() => store.forget(input));
      }
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

// A runner that also sends batches, as redisCommandRunner's do for every client it wraps: each batch
// is recorded as one entry, and WAIT answers `acknowledged`.
const pipelining = (acknowledged: number, reply: (args: readonly (string | Buffer)[]) => unknown) => {
  const sent: string[][][] = [];
  const runner: RedisCommandRunner = {
    send: async (_key, args) => {
      sent.push([args.map(String)]);
      return reply(args);
    },
    sendPipeline: async (_key, commands) => {
      sent.push(commands.map((args) => args.map(String)));
      return commands.map((args) => (args[0] === 'WAIT' ? acknowledged : reply(args)));
    },
  };
  return { runner, sent };
};

const completeInput = {
  id: 'a',
  token: 't',
  response: { status: 201, headers: {}, body: new Uint8Array() },
  retentionMs: 60_000,
};

describe('redisStore waitForReplicas', () => {
  it.each([
    ['no object', 2],
    ['a count of 0', { count: 0, timeout: '200ms' }],
    ['a fractional count', { count: 1.5, timeout: '200ms' }],
    ['a count as a string', { count: '1', timeout: '200ms' }],
    ['no timeout', { count: 1 }],
    // WAIT 1 0 blocks until a replica answers, for ever: the store would hang on a missing replica.
    ['a timeout of 0', { count: 1, timeout: 0 }],
    ['an unreadable timeout', { count: 1, timeout: 'soon' }],
    ['a misspelt name', { count: 1, timeoutMs: 200 }],
    // Was wrong: these two passed the checks, and String() wrote them as '1e+21', which WAIT refuses
    // ("value is not an integer or out of range"): every write a 503, each claim set and freed again.
    ['a count past the integers a number holds exactly', { count: 1e21, timeout: 200 }],
    ['a timeout past the integers a number holds exactly', { count: 1, timeout: 1e21 }],
    // Held: refused already.
    ['a negative timeout', { count: 1, timeout: -200 }],
    ['a timeout that is not a number', { count: 1, timeout: Number.NaN }],
    ['an infinite timeout', { count: 1, timeout: Number.POSITIVE_INFINITY }],
    ['an infinite count', { count: Number.POSITIVE_INFINITY, timeout: 200 }],
  ])('refuses %s with a TypeError naming the option', (_, waitForReplicas) => {
    expect(() => redisStore({ client: pipelining(1, () => null).runner, waitForReplicas } as never)).toThrow(
      /waitForReplicas/,
    );
    expect(() => redisStore({ client: pipelining(1, () => null).runner, waitForReplicas } as never)).toThrow(TypeError);
  });

  it('refuses a runner that cannot send a write and its WAIT together, since a WAIT on another connection proves nothing', () => {
    expect(() => redisStore({ client: recorder().runner, waitForReplicas: { count: 1, timeout: '200ms' } })).toThrow(
      /waitForReplicas needs a client that sends pipelines/,
    );
  });

  it('sends nothing more when it is off: a write is one command', async () => {
    const { runner, sent } = pipelining(0, () => Buffer.from('OK'));
    const store = redisStore({ client: runner });
    expect(await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    expect(sent).toEqual([[expect.arrayContaining(['SET', 'idem:a'])]]);
  });

  it('sends WAIT count timeout behind every write, in the same pipeline', async () => {
    const { runner, sent } = pipelining(2, (args) => (args[0] === 'SET' ? Buffer.from('OK') : 1));
    const store = redisStore({ client: runner, waitForReplicas: { count: 2, timeout: '0.2s' } });
    expect(await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    expect(await store.renew({ id: 'a', token: 't', leaseMs: 1_000 })).toBe(true);
    expect(await store.complete(completeInput)).toBe(true);
    expect(await store.release({ id: 'a', token: 't' })).toBe(true);
    expect(await store.forget({ id: 'a', token: 't' })).toBe(true);
    expect(sent.map((batch) => batch.map((args) => args[0]))).toEqual(
      Array.from({ length: 5 }, (_, i) => [i === 0 ? 'SET' : 'EVALSHA', 'WAIT']),
    );
    for (const batch of sent) expect(batch[1]).toEqual(['WAIT', '2', '200']);
  });

  it('answers a write that too few replicas acknowledged as store unavailable (503), never as done', async () => {
    const { runner } = pipelining(1, (args) => (args[0] === 'SET' ? Buffer.from('OK') : 1));
    const store = redisStore({ client: runner, waitForReplicas: { count: 2, timeout: 200 } });
    for (const attempt of [
      () => store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 }),
      () => store.renew({ id: 'a', token: 't', leaseMs: 1_000 }),
      () => store.complete(completeInput),
      () => store.release({ id: 'a', token: 't' }),
      () => store.forget({ id: 'a', token: 't' }),
    ]) {
      const error = await attempt().catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(StoreUnavailableError);
      expect((error as Error).message).toMatch(/1 of 2 replicas acknowledged/);
    }
  });

  // Was wrong (in this change's first version): a claim whose WAIT fell short was answered 503 but
  // stayed on the primary, so the client's retry got 409 for a whole lease although no handler ran.
  it('frees a claim that too few replicas acknowledged, so the 503 is retried at once instead of meeting a 409', async () => {
    const { runner, sent } = pipelining(0, (args) => (args[0] === 'SET' ? Buffer.from('OK') : 1));
    const store = redisStore({ client: runner, waitForReplicas: { count: 1, timeout: 200 } });
    const claim = store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 });
    await expect(claim).rejects.toBeInstanceOf(StoreUnavailableError);
    // The release goes alone: waiting for the replicas to have a delete would only fail it the same way.
    expect(sent.map((batch) => batch.map((args) => args[0]))).toEqual([['SET', 'WAIT'], ['EVALSHA']]);
    expect(sent[1]?.[0]?.slice(2, 4)).toEqual(['1', 'idem:a']);
  });

  // Was wrong: only a WAIT that answered too few was freed. A WAIT that failed (Sentinel's switch
  // answers a waiting one UNBLOCKED, an ACL may refuse WAIT) rejects the pipeline after its SET ran,
  // and that claim stayed: the 503's retry met a 409 for a whole lease, though no handler ran.
  it('frees a claim whose WAIT failed after its SET ran, as one too few replicas acknowledged', async () => {
    const sent: string[] = [];
    const runner: RedisCommandRunner = {
      send: async (_key, args) => {
        sent.push(String(args[0]));
        return 1;
      },
      sendPipeline: async (_key, commands) => {
        sent.push(...commands.map((args) => String(args[0])));
        throw new Error('UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)');
      },
    };
    const store = redisStore({ client: runner, waitForReplicas: { count: 1, timeout: 200 } });
    const claim = store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 });
    await expect(claim).rejects.toBeInstanceOf(StoreUnavailableError);
    expect(sent).toEqual(['SET', 'WAIT', 'EVALSHA']);
  });

  it('Held: sends the largest count and timeout a number holds exactly as plain digits', async () => {
    const { runner, sent } = pipelining(Number.MAX_SAFE_INTEGER, (args) => (args[0] === 'SET' ? Buffer.from('OK') : 1));
    const store = redisStore({
      client: runner,
      waitForReplicas: { count: Number.MAX_SAFE_INTEGER, timeout: Number.MAX_SAFE_INTEGER },
    });
    expect(await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    expect(sent[0]?.[1]).toEqual(['WAIT', '9007199254740991', '9007199254740991']);
  });

  // Was wrong: a claim found held by its own token (its SET ran, every reply of the pipeline was
  // lost, and ioredis sent the pipeline again on a new connection, where SET NX found the key) was
  // answered claimed whatever the replicas had: the WAIT behind the resent SET counts, by its
  // contract, the new connection's writes, and that SET wrote nothing.
  const ownClaim = (acknowledged: number) =>
    pipelining(acknowledged, (args) => {
      if (args[0] === 'SET') return null;
      if (args[0] === 'GET') return encodeClaim('t', '', 0);
      return 1;
    });

  it('confirms a claim found held by its own token with a renewal and its WAIT before answering it claimed', async () => {
    const { runner, sent } = ownClaim(1);
    const store = redisStore({ client: runner, waitForReplicas: { count: 1, timeout: 200 } });
    expect(await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    expect(sent.map((batch) => batch.map((args) => args[0]))).toEqual([['SET', 'WAIT'], ['GET'], ['EVALSHA', 'WAIT']]);
    // The renewal sets the lease asked for: the claim's, not a longer one.
    expect(sent[2]?.[0]?.slice(2, 4)).toEqual(['1', 'idem:a']);
    expect(sent[2]?.[0]?.[5]).toBe('1000');
  });

  it('answers 503, and frees it, a claim found held by its own token that too few replicas acknowledged', async () => {
    const { runner, sent } = ownClaim(0);
    const store = redisStore({ client: runner, waitForReplicas: { count: 1, timeout: 200 } });
    await expect(store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 })).rejects.toBeInstanceOf(
      StoreUnavailableError,
    );
    expect(sent.map((batch) => batch.map((args) => args[0]))).toEqual([
      ['SET', 'WAIT'],
      ['GET'],
      ['EVALSHA', 'WAIT'],
      ['EVALSHA'],
    ]);
  });

  it('does not hold a write that changed nothing (a fenced one) to the replicas: its answer is false', async () => {
    const { runner } = pipelining(0, () => 0);
    const store = redisStore({ client: runner, waitForReplicas: { count: 1, timeout: 200 } });
    expect(await store.complete(completeInput)).toBe(false);
    expect(await store.release({ id: 'a', token: 't' })).toBe(false);
  });
});
