// Claims of the documentation checked against the engine (docs audit of 2026-12).
import { createIdempotency, memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';

describe('docs/migrating.md', () => {
  // docs/migrating.md, the express-idempotency table, `processingTimeout` row, and its "A crash
  // mid-request" row: after one lease a retry of the same request runs, another request under the key
  // gets 422 for the retention. (The first row once said the key was "free" after one lease.)
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
