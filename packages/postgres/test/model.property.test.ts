// Model-based property test: random sequences of claim, renew, complete, release, forget, get and
// "time passes" run against postgresStore on PGlite and against memoryStore from @idem/core (the
// reference model) must give the same answer at every step.
import { PGlite } from '@electric-sql/pglite';
import { memoryStore, type Store, type StoreRecord } from '@idem/core';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, type PostgresStore, postgresStore } from '../src/index.js';

const ids = ['a', 'b', 'c'];
const tokens = ['t0', 't1', 't2', 't3'];

type Command =
  | { op: 'claim'; id: string; token: string; fingerprint: string }
  | { op: 'renew'; id: string; token: string }
  | { op: 'complete'; id: string; token: string; status: number; body: number[] }
  | { op: 'release'; id: string; token: string }
  | { op: 'forget'; id: string; token: string }
  | { op: 'get'; id: string }
  | { op: 'elapse' };

const id = fc.constantFrom(...ids);
const token = fc.constantFrom(...tokens);
const command: fc.Arbitrary<Command> = fc.oneof(
  fc.record({ op: fc.constant('claim' as const), id, token, fingerprint: fc.constantFrom('', 'fp1', 'fp2') }),
  fc.record({ op: fc.constant('renew' as const), id, token }),
  fc.record({
    op: fc.constant('complete' as const),
    id,
    token,
    status: fc.constantFrom(200, 201, 500),
    body: fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 8 }),
  }),
  fc.record({ op: fc.constant('release' as const), id, token }),
  fc.record({ op: fc.constant('forget' as const), id, token }),
  fc.record({ op: fc.constant('get' as const), id }),
  fc.constant({ op: 'elapse' as const }),
);

// Records compared as plain data: bodies as arrays, so a Buffer and a Uint8Array compare equal.
const plain = (record: StoreRecord | undefined) =>
  record?.state === 'completed'
    ? { ...record, response: { ...record.response, body: [...record.response.body] } }
    : record;

const apply = async (store: Store, c: Exclude<Command, { op: 'elapse' }>): Promise<unknown> => {
  switch (c.op) {
    case 'claim': {
      const result = await store.claim({ id: c.id, token: c.token, fingerprint: c.fingerprint, leaseMs: 60_000 });
      return result.claimed ? result : { claimed: false, record: plain(result.record) };
    }
    case 'renew':
      return store.renew({ id: c.id, token: c.token, leaseMs: 60_000 });
    case 'complete':
      return store.complete({
        id: c.id,
        token: c.token,
        response: { status: c.status, headers: { 'x-step': String(c.body.length) }, body: new Uint8Array(c.body) },
        retentionMs: 120_000,
      });
    case 'release':
      return store.release({ id: c.id, token: c.token });
    case 'forget':
      if (store.forget === undefined) throw new Error('both stores have forget');
      return store.forget({ id: c.id, token: c.token });
    case 'get':
      return plain(await store.get(c.id));
  }
};

describe('postgresStore behaves like the reference memoryStore', () => {
  let db: PGlite;
  let store: PostgresStore;

  beforeAll(async () => {
    db = new PGlite();
    await migrate(db, { table: 'model_records' });
    store = postgresStore({ client: db, table: 'model_records' });
  });
  afterAll(async () => {
    await db.close();
  });

  it('gives the same answer as the model at every step of random histories', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(command, { maxLength: 25 }), async (commands) => {
        await db.query('TRUNCATE model_records');
        let now = 1_000_000;
        const model = memoryStore({ now: () => now });
        for (const c of commands) {
          if (c.op === 'elapse') {
            // Longer than any lease or retention above: everything expires, on both sides.
            now += 1_000_000;
            await db.query(`UPDATE model_records SET expires_at = clock_timestamp() - interval '1 millisecond'`);
            continue;
          }
          expect(await apply(store, c), JSON.stringify(c)).toEqual(await apply(model, c));
        }
      }),
      { numRuns: 150 },
    );
  });
});
