// Claims of the documentation checked against the engine (docs audit of 2026-12). An `it.fails`
// states what a page says where the code does otherwise: it passes while the two differ.
import { createIdempotency, memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';

describe('docs/migrating.md', () => {
  // docs/migrating.md, the express-idempotency table, `processingTimeout` row: "A crashed request's key
  // is free after one lease, not after the adapter's TTL". After one lease the crashed attempt's record
  // is abandoned, not free: the same request takes it over, another one under the key gets 422 for the
  // retention (as the same page's "A crash mid-request" row, concepts.md and operations.md say).
  it.fails("a crashed request's key is free after one lease: another request under it runs", async () => {
    let now = Date.UTC(2026, 0, 1);
    const engine = createIdempotency({ store: memoryStore({ now: () => now }), heartbeat: false, now: () => now });
    const request = { key: 'k-crash', scope: 'user:alice', operation: 'POST /charges' };
    const crashed = await engine.begin({ ...request, fingerprint: 'first' });
    expect(crashed.kind).toBe('execute');
    // The process died: nobody renews the lease, and one lease (10 s) passes.
    now += 10_001;
    const other = await engine.begin({ ...request, fingerprint: 'second' });
    expect(other.kind).toBe('execute');
  });

  // What the code does instead, and what the "A crash mid-request" row says.
  it('after one lease the same request takes the crashed key over, another request gets 422', async () => {
    let now = Date.UTC(2026, 0, 1);
    const engine = createIdempotency({ store: memoryStore({ now: () => now }), heartbeat: false, now: () => now });
    const request = { key: 'k-crash', scope: 'user:alice', operation: 'POST /charges' };
    expect((await engine.begin({ ...request, fingerprint: 'first' })).kind).toBe('execute');
    now += 10_001;
    const other = await engine.begin({ ...request, fingerprint: 'second' });
    expect(other).toMatchObject({ kind: 'reject', error: { code: 'fingerprint_mismatch', status: 422 } });
    const same = await engine.begin({ ...request, fingerprint: 'first' });
    expect(same.kind).toBe('execute');
    if (same.kind === 'execute') expect(same.lease.recovered).toBe(true);
  });
});
