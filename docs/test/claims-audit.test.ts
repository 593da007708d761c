// Claims of the documentation checked against the engine (docs audit of 2026-12).
import { readFileSync } from 'node:fs';
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

describe('docs/security.md', () => {
  // docs/security.md, "What is stored, and for how long", the idempotency record's row. (Audit of data at
  // rest.) Was wrong: the row said a record lives "the lease (10 s) while running", but every claim the
  // engine makes is kept a retention after its lease (stores.md "Abandoned records"): a crashed
  // attempt's record, with its fingerprint, stays 24 h and 10 s (on PostgreSQL until purged, an hour
  // later still). Someone sizing the store or listing what it holds took it for ten seconds.
  it('a claim whose holder crashed stays a whole retention after its lease, as the row says', async () => {
    let now = Date.UTC(2026, 0, 1);
    const fp = 'f'.repeat(64); // a hex SHA-256, kept as given
    const store = memoryStore({ now: () => now });
    const engine = createIdempotency({ store, heartbeat: false, now: () => now });
    const started = await engine.begin({ key: 'k', scope: 'user:alice', operation: 'POST /charges', fingerprint: fp });
    expect(started.kind).toBe('execute');
    if (started.kind !== 'execute') return;
    const { leaseMs, retentionMs } = engine.settings;
    now += leaseMs + retentionMs - 1;
    expect(store.get(started.lease.id)).toMatchObject({ state: 'abandoned', fingerprint: fp });
    now += 1;
    expect(store.get(started.lease.id)).toBeUndefined();

    const text = readFileSync(new URL('../security.md', import.meta.url), 'utf8');
    const row = text.split('\n').find((line) => line.startsWith('| Idempotency record (memory, Redis, PostgreSQL)'));
    const howLong = row?.split('|')[3] ?? '';
    // The row names the keep of a crashed claim, and that PostgreSQL's rows wait for the purge.
    expect(howLong).toMatch(/crashed[^|]*retention after its lease/);
    expect(howLong).toMatch(/purge/);
  });
});
