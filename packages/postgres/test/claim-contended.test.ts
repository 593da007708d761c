// A claim PostgreSQL answered every time but that could not settle (the record kept changing between
// its statements) is a store that answered, with the key live elsewhere: under
// storeUnavailable: 'fail-open' it must fail closed (503 with Retry-After), never run the request
// beside that live holder.
import { PGlite } from '@electric-sql/pglite';
import { createIdempotency, type IdempotencyEvent, isStoreUnavailableError } from '@idem/core';
import { afterAll, describe, expect, it } from 'vitest';
import { migrate, type PGliteLike, postgresStore } from '../src/index.js';

describe('a claim that kept racing', () => {
  const real = new PGlite();
  afterAll(() => real.close());

  it('fails closed under fail-open, with StoreContendedError, not StoreUnavailableError', async () => {
    await migrate(real, { table: 'idem_contended' });
    // Every claim statement finds the record changed under it: no row back, as when a holder frees
    // the key between the statement's read and its write.
    const churning: PGliteLike = {
      query: async <Row>(text: string, params?: unknown[]) => {
        const result = await real.query<Row>(text, params);
        const row = result.rows[0] as object | undefined;
        return row !== undefined && 'claimed' in row ? { ...result, rows: [] } : result;
      },
      // A PGlite to the store (it tells the clients apart by their methods); never called here.
      transaction: real.transaction.bind(real),
    };
    const store = postgresStore({ client: churning, table: 'idem_contended' });
    const direct = await store
      .claim({ id: 'r1', token: 't1', fingerprint: 'f', leaseMs: 60_000 })
      .catch((caught: unknown) => caught);
    expect(direct).toMatchObject({ name: 'StoreContendedError', code: 'store_contended' });
    expect(isStoreUnavailableError(direct)).toBe(false);

    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, onEvent: (event) => events.push(event) });
    const started = await engine.begin({
      key: 'k1',
      scope: 'caller',
      operation: 'POST /charges',
      fingerprint: 'f',
      storeUnavailable: 'fail-open',
    });
    expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable', status: 503 } });
    expect(started.kind === 'reject' && started.error.retryAfter).toBeGreaterThan(0);
    expect(events).toMatchObject([{ type: 'store-error', phase: 'claim', error: { name: 'StoreContendedError' } }]);
    expect(events.some((event) => 'unprotected' in event)).toBe(false);
  });
});
