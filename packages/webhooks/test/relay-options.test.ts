import { describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';

// Construction only: the relay's options are checked before it ever queries, so a stand-in `db`
// that would answer nothing is enough.
const db = { query: async () => ({ rows: [], rowCount: 0 }) };

describe('relay options', () => {
  // Was a defect: a lease past Node's timer limit (about 24.9 days) was accepted, and the timer that
  // gives up a round after its lease then fired at once: every round failed with relay_round_timeout.
  it('refuses a lease no timer can hold', () => {
    const sender = createSender({ secret: `whsec_${Buffer.alloc(32, 1).toString('base64')}` });
    const outbox = createOutbox();
    expect(() => outbox.relay({ db: db as never, sender, lease: '25d' })).toThrow(
      /lease must be at most 2147483647 ms/,
    );
    expect(() => outbox.relay({ db: db as never, sender, lease: '24d' })).not.toThrow();
  });

  // Was a defect: the default lease (the sender's timeout + 15 s) of a sender whose timeout is within
  // 15 s of Node's timer limit went past it, and relay() threw about a `lease` never given. The
  // default is now capped at that limit; a timeout that leaves no room at all says so.
  it("keeps the default lease within Node's timer limit, and names the timeout when it leaves no room", () => {
    const secret = `whsec_${Buffer.alloc(32, 1).toString('base64')}`;
    const outbox = createOutbox();
    const late = createSender({ secret, timeout: 2_147_483_647 - 10_000 });
    expect(() => outbox.relay({ db: db as never, sender: late })).not.toThrow();
    const whole = createSender({ secret, timeout: 2_147_483_647 });
    expect(() => outbox.relay({ db: db as never, sender: whole })).toThrow(
      new TypeError("the sender's timeout leaves no room for the relay's lease (at most 2147483647 ms): shorten it"),
    );
    expect(() => outbox.relay({ db: db as never, sender: late, lease: 2_147_483_647 - 20_000 })).toThrow(
      new TypeError("lease must be longer than the sender's per-attempt timeout"),
    );
  });

  // Was a defect: an integer past 2^53 passed Number.isInteger, and pg sends 1e21 as "1e+21", which
  // PostgreSQL refuses for LIMIT (22P02): every relay round, or every deadLetters() call, failed
  // with a database error instead of a TypeError at construction.
  it('refuses a batchSize, or a deadLetters() limit, that is not a safe integer', async () => {
    const sender = createSender({ secret: `whsec_${Buffer.alloc(32, 1).toString('base64')}` });
    const outbox = createOutbox();
    expect(() => outbox.relay({ db: db as never, sender, batchSize: 1e21 })).toThrow(
      new TypeError('batchSize must be a positive safe integer (at most 9007199254740991)'),
    );
    await expect(outbox.deadLetters(db as never, { limit: 1e21 })).rejects.toThrow(
      new TypeError('limit must be a positive safe integer (at most 9007199254740991)'),
    );
    expect(() => outbox.relay({ db: db as never, sender, batchSize: Number.MAX_SAFE_INTEGER })).not.toThrow();
  });

  it('refuses a maxPerUrl that is not a positive integer up to batchSize', () => {
    const sender = createSender({ secret: `whsec_${Buffer.alloc(32, 1).toString('base64')}` });
    const outbox = createOutbox();
    for (const maxPerUrl of [0, -1, 1.5, Number.NaN, 11, '5' as never]) {
      expect(() => outbox.relay({ db: db as never, sender, batchSize: 10, maxPerUrl })).toThrow(
        new TypeError('maxPerUrl must be a positive integer, at most batchSize'),
      );
    }
    for (const maxPerUrl of [1, 10, undefined]) {
      expect(() => outbox.relay({ db: db as never, sender, batchSize: 10, maxPerUrl })).not.toThrow();
    }
    // A batch of 1 gets a share of 1, not 0 (which would claim nothing).
    expect(() => outbox.relay({ db: db as never, sender, batchSize: 1 })).not.toThrow();
  });
});
