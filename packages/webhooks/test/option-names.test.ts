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
