import { describe, expect, it } from 'vitest';
import {
  createOutbox,
  createReceiver,
  createSender,
  createSigner,
  createVerifier,
  generateSecret,
} from '../src/index.js';

const secret = (generateSecret('v1') as { secret: string }).secret;
const db = { query: async () => ({ rows: [], rowCount: 0 }) };

// A misspelt option used to be ignored and its default used without a word.
describe('unknown option names are refused at construction', () => {
  it('sender, its schedule, receiver, signer, verifier, outbox and relay', () => {
    expect(() => createSender({ secret, timout: '5s' } as never)).toThrow(
      'createSender: unknown option "timout" (did you mean "timeout"?)',
    );
    expect(() => createSender({ secret, schedule: { maxAttempt: 3 } } as never)).toThrow(
      'schedule: unknown option "maxAttempt" (did you mean "maxAttempts"?)',
    );
    expect(() => createSender({ secret, schedule: '1h' } as never)).toThrow('schedule must be an object');
    expect(() => createSender({ secret, maxAttempts: 3 } as never)).toThrow(
      'createSender: maxAttempts belongs in schedule: createSender({ schedule: { maxAttempts } })',
    );
    expect(() => createReceiver({ secret, apply: async () => {}, tolerence: '1m' } as never)).toThrow(
      'createReceiver: unknown option "tolerence" (did you mean "tolerance"?)',
    );
    expect(() => createSigner({ secret, secrets: [secret] } as never)).toThrow(
      'createSigner: unknown option "secrets"',
    );
    expect(() => createVerifier({ secret, clock: Date.now } as never)).toThrow(
      'createVerifier: unknown option "clock"',
    );
    expect(() => createOutbox({ tableName: 'x' } as never)).toThrow('createOutbox: unknown option "tableName"');
    const sender = createSender({ secret });
    expect(() => createOutbox().relay({ db, sender, batch: 5 } as never)).toThrow('relay: unknown option "batch"');
    expect(() => createOutbox().relay({ db, sender, pollInterval: '2s', batchSize: 5 })).not.toThrow();
  });

  it('outbox.purge: an unknown option, a missing or malformed olderThan, a bad batchSize, dead or signal', async () => {
    const outbox = createOutbox();
    await expect(outbox.purge(db, { olderThan: '30d', olderthan: '1d' } as never)).rejects.toThrow(
      new TypeError('purge: unknown option "olderthan" (did you mean "olderThan"?)'),
    );
    await expect(outbox.purge(db, { olderThan: '30d', batch: 10 } as never)).rejects.toThrow(
      'purge: unknown option "batch"',
    );
    await expect(outbox.purge(db, {} as never)).rejects.toThrow(new TypeError("purge needs olderThan (such as '30d')"));
    await expect(outbox.purge(db, undefined as never)).rejects.toThrow(TypeError);
    await expect(outbox.purge(undefined as never, { olderThan: '30d' })).rejects.toThrow(
      new TypeError('purge needs db (a pg Pool or client)'),
    );
    for (const olderThan of ['30 days', '-1d', -5, Number.NaN, Number.POSITIVE_INFINITY, '', null]) {
      await expect(outbox.purge(db, { olderThan: olderThan as never }), String(olderThan)).rejects.toThrow(
        /^olderThan must be/,
      );
    }
    for (const batchSize of [0, -1, 1.5, '10', 1e21, Number.NaN]) {
      await expect(
        outbox.purge(db, { olderThan: '30d', batchSize: batchSize as never }),
        String(batchSize),
      ).rejects.toThrow(new TypeError('batchSize must be a positive safe integer (at most 9007199254740991)'));
    }
    await expect(outbox.purge(db, { olderThan: '30d', dead: 'yes' as never })).rejects.toThrow(
      new TypeError('dead must be true or false'),
    );
    await expect(outbox.purge(db, { olderThan: '30d', signal: { aborted: false } as never })).rejects.toThrow(
      new TypeError('signal must be an AbortSignal'),
    );
    // Every name it takes, and a Duration in either form.
    const signal = new AbortController().signal;
    await expect(outbox.purge(db, { olderThan: '30d', dead: true, batchSize: 10, signal })).resolves.toEqual({
      deleted: 0,
    });
    await expect(outbox.purge(db, { olderThan: 0 })).resolves.toEqual({ deleted: 0 });
  });

  // A misspelt `after` was ignored: every call returned the first page again, and a pager that
  // loops until `next` is undefined never ended.
  it('outbox.deadLetters and requeue: an unknown option, no db, an options value or id of the wrong type', async () => {
    const outbox = createOutbox();
    await expect(outbox.deadLetters(db, { limit: 10, cursor: 'x' } as never)).rejects.toThrow(
      new TypeError('deadLetters: unknown option "cursor"; it takes limit, after'),
    );
    await expect(outbox.deadLetters(db, { limit: 10, After: 'x' } as never)).rejects.toThrow(
      new TypeError('deadLetters: unknown option "After" (did you mean "after"?)'),
    );
    await expect(outbox.deadLetters(db, null as never)).rejects.toThrow(
      new TypeError('deadLetters takes an options object'),
    );
    await expect(outbox.deadLetters(undefined as never)).rejects.toThrow(
      new TypeError('deadLetters needs db (a pg Pool or client)'),
    );
    await expect(outbox.requeue(undefined as never, 'evt_1')).rejects.toThrow(
      new TypeError('requeue needs db (a pg Pool or client)'),
    );
    // An id that is not a string matched no row, and requeue() said false as for a row not dead.
    for (const id of [undefined, null, 1, { id: 'evt_1' }]) {
      await expect(outbox.requeue(db, id as never), String(id)).rejects.toThrow(
        new TypeError('requeue needs the id of a dead event (a string)'),
      );
    }
    // Every name it takes.
    await expect(outbox.deadLetters(db, { limit: 10, after: undefined })).resolves.toEqual({
      rows: [],
      next: undefined,
    });
    await expect(outbox.deadLetters(db)).resolves.toEqual({ rows: [], next: undefined });
    await expect(outbox.requeue(db, 'evt_1')).resolves.toBe(false);
  });

  it('a relay pollInterval under 10ms is refused: 0 queried the database back to back while idle', () => {
    const sender = createSender({ secret });
    for (const pollInterval of [0, '0s', '5ms', 9]) {
      expect(
        () => createOutbox().relay({ db, sender, pollInterval: pollInterval as never }),
        String(pollInterval),
      ).toThrow(new TypeError('pollInterval must be at least 10ms'));
    }
    expect(() => createOutbox().relay({ db, sender, pollInterval: '10ms' })).not.toThrow();
  });
});
