// Abandoned records on a real Redis, beyond describeStore(): the cases a mutation run of the
// keep/takeover code (scripts.ts inspectScript, redis-store.ts claim and read) found unchecked.
// Each test says which wrong variant of the code it tells apart from the right one.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { type RedisCommandRunner, redisCommandRunner, redisStore, UnexpectedReplyError } from '../src/index.js';
import { claimKeepMs, decodeRecord, encodeClaim, RecordFormatError } from '../src/record-codec.js';
import { inspectScript } from '../src/scripts.js';
import { deleteKeys, redisAvailable, redisUrl } from './redis-env.js';

const withRedis = await redisAvailable();

// One prefix per file and run, so parallel files and earlier runs never meet.
const prefix = `idem-test:abandoned-mutants:${randomUUID()}:`;

const leaseMs = 5_000;
const keepMs = 60_000;
// Slack for the time the checks themselves take on a slow machine.
const slackMs = 2_000;

describe('record codec: the keep line, its corners', () => {
  it('reads back every keep encodeClaim writes, up to the largest safe integer (16 digits)', () => {
    for (const keep of [1, 9, 10, 86_400_000, 999_999_999_999_999, Number.MAX_SAFE_INTEGER]) {
      const claim = encodeClaim('t', 'fp', keep);
      expect(claimKeepMs(claim)).toBe(keep);
      expect(decodeRecord(claim, keep)).toEqual({ state: 'abandoned', token: 't', fingerprint: 'fp' });
    }
  });

  it('claimKeepMs refuses a completed record, also one cut short after its fingerprint', () => {
    expect(() => claimKeepMs(Buffer.from('c"t"\n"f"\n'))).toThrow(RecordFormatError);
  });
});

describe.runIf(withRedis)('@idem/redis abandoned records, the corners', () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  // The commands a store sends, through the real client; `reshape` may change a script's reply.
  const traced = (reshape?: (args: readonly unknown[], reply: unknown) => unknown) => {
    const real = redisCommandRunner(admin);
    const sent: string[] = [];
    const runner: RedisCommandRunner = {
      send: async (key, args) => {
        sent.push(String(args[0]));
        const reply = await real.send(key, args);
        return reshape ? reshape(args, reply) : reply;
      },
    };
    return { store: redisStore({ client: runner, prefix }), sent };
  };
  const value = async (key: string) => (await admin.getBuffer(key))?.toString();
  // What the server's clock does when a crashed holder's lease runs out: the time left becomes the keep.
  const endLease = (key: string) => admin.pexpire(key, keepMs);

  it('a takeover that wins is one script, and its claim lives its own lease plus its keep', async () => {
    const { store, sent } = traced();
    await admin.script('LOAD', inspectScript.source); // else a first EVALSHA falls back to EVAL
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
    await endLease(store.key(id));
    sent.length = 0;
    expect(
      await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs, replaces: 'a' }),
    ).toEqual({ claimed: true });
    // Answered 1 by the script itself (a variant that answered otherwise would find its own claim
    // only through a SET, a GET and a second script).
    expect(sent).toEqual(['EVALSHA']);
    expect(await value(store.key(id))).toBe(`p"b"\n"fp"\n${keepMs}\n`);
    // The new claim's PX, not the old key's time left (KEEPTTL) and not no expiry at all.
    const ttl = await admin.pttl(store.key(id));
    expect(ttl).toBeGreaterThan(leaseMs + keepMs - slackMs);
    expect(ttl).toBeLessThanOrEqual(leaseMs + keepMs);
    expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp' });
  });

  it('a takeover naming a token whose key is gone (its keep ended, or it was released) claims the key afresh', async () => {
    const { store, sent } = traced();
    await admin.script('LOAD', inspectScript.source);
    const id = randomUUID();
    sent.length = 0;
    expect(
      await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs, replaces: 'a' }),
    ).toEqual({ claimed: true });
    // The script finds nothing (0), and the plain SET NX claims: no error, no second script.
    expect(sent).toEqual(['EVALSHA', 'SET']);
    expect(await value(store.key(id))).toBe(`p"b"\n"fp"\n${keepMs}\n`);
    const ttl = await admin.pttl(store.key(id));
    expect(ttl).toBeGreaterThan(leaseMs + keepMs - slackMs);

    // The same after a release of the abandoned record by its holder, between the answer and the takeover.
    const released = randomUUID();
    await store.claim({ id: released, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
    await endLease(store.key(released));
    expect((await store.get(released))?.state).toBe('abandoned');
    expect(await store.release({ id: released, token: 'a' })).toBe(true);
    expect(
      await store.claim({
        id: released,
        token: 'c',
        fingerprint: 'fp',
        leaseMs,
        keepAfterLeaseMs: keepMs,
        replaces: 'a',
      }),
    ).toEqual({ claimed: true });
    expect(await store.get(released)).toEqual({ state: 'in_progress', token: 'c', fingerprint: 'fp' });
  });

  it('a lease with a few seconds left is still live: not abandoned, not taken over', async () => {
    const { store } = traced();
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: keepMs });
    // 3 s of lease left (PTTL keep + 3000): live for the three commands below, however slow the box.
    await admin.pexpire(store.key(id), keepMs + 3_000);
    const live = { state: 'in_progress', token: 'a', fingerprint: 'fp' };
    expect(await store.get(id)).toEqual(live);
    expect(
      await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs, replaces: 'a' }),
    ).toEqual({ claimed: false, record: live });
    expect(await value(store.key(id))).toBe(`p"a"\n"fp"\n${keepMs}\n`);
  });

  it('a claim whose key has no expiry (PTTL -1, persisted by hand) is nobody’s lease: never abandoned, never taken over', async () => {
    const { store } = traced();
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
    await admin.persist(store.key(id));
    const live = { state: 'in_progress', token: 'a', fingerprint: 'fp' };
    expect(await store.get(id)).toEqual(live);
    expect(
      await store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs, replaces: 'a' }),
    ).toEqual({ claimed: false, record: live });
    expect(await value(store.key(id))).toBe(`p"a"\n"fp"\n${keepMs}\n`);
    expect(await admin.pttl(store.key(id))).toBe(-1);
    await admin.del(store.key(id));
  });

  it('refuses a replaces that is no token (not a string, or empty), before anything is sent', async () => {
    const { store, sent } = traced();
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
    await endLease(store.key(id));
    sent.length = 0;
    for (const replaces of [5, null, '', { toString: () => 'a' }] as unknown as string[]) {
      await expect(
        store.claim({ id, token: 'b', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs, replaces }),
      ).rejects.toThrow(TypeError);
    }
    expect(sent).toEqual([]);
    expect((await store.get(id))?.state).toBe('abandoned');
  });

  it('rounds a fractional keep up, as it does a lease, and refuses a keep that is no number', async () => {
    const { store } = traced();
    const id = randomUUID();
    expect(await store.claim({ id, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: 1_500.2 })).toEqual({
      claimed: true,
    });
    expect(await value(store.key(id))).toBe('p"a"\n"fp"\n1501\n');
    for (const keepAfterLeaseMs of ['5', Number.NaN, -1] as unknown as number[]) {
      await expect(
        store.claim({ id: randomUUID(), token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs }),
      ).rejects.toThrow(TypeError);
    }
  });

  // UnexpectedReplyError, not StoreUnavailableError: Redis answered, in a shape this store cannot read
  // (a client's reply mapping), so `storeUnavailable: 'fail-open'` stays closed on it.
  it('answers UnexpectedReplyError for an inspect reply that is not {value, PTTL}, never a guess', async () => {
    const id = randomUUID();
    const { store: writer } = traced();
    await writer.claim({ id, token: 'a', fingerprint: 'fp', leaseMs, keepAfterLeaseMs: keepMs });
    await endLease(writer.key(id));
    const isInspect = (args: readonly unknown[]) =>
      (args[0] === 'EVALSHA' && args[1] === inspectScript.sha) ||
      (args[0] === 'EVAL' && args[1] === inspectScript.source);
    const shapes: Array<[string, (reply: unknown) => unknown]> = [
      ['a third element', (reply) => (Array.isArray(reply) ? [...reply, 1] : reply)],
      ['a PTTL that is no integer', (reply) => (Array.isArray(reply) ? [reply[0], 'soon'] : reply)],
    ];
    for (const [, shape] of shapes) {
      const { store } = traced((args, reply) => (isInspect(args) ? shape(reply) : reply));
      await expect(store.get(id)).rejects.toBeInstanceOf(UnexpectedReplyError);
      await expect(
        store.claim({ id, token: 'b', fingerprint: 'fp2', leaseMs, keepAfterLeaseMs: keepMs }),
      ).rejects.toBeInstanceOf(UnexpectedReplyError);
    }
    expect((await writer.get(id))?.state).toBe('abandoned');
  });
});
