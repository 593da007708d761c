// Audit of describeStore() from a store author's side, for a store behind a network: its harness
// gives `ttl` (a record's remaining life as the server measures it), not `advance`, as a SQL or
// key-value store's must. The store is audit-support/server-clock-store.ts; the suite runs in a
// child vitest (audit-support/child-vitest.ts) on the fixture server-clock-store.fixture.ts, so a
// check the suite fails is read from its report, hooks and skips included.
//
// Found writing a MariaDB store from docs/stores.md with the packed @idem/core and @idem/testkit:
// both bugs below, written into that store, passed every check of describeStore().
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { type ChildResult, fixtureConfig, runChildVitest } from './audit-support/child-vitest.js';
import { serverClockBugs, serverClockHarness } from './audit-support/server-clock-store.js';

const fixture = join(import.meta.dirname, 'audit-support', 'server-clock-store.fixture.ts');

let results: ChildResult[] = [];
const checksOf = (variant: string) =>
  results.filter((a) => a.ancestorTitles.some((title) => title === `Store contract: variant=${variant}`));
const failedChecks = (variant: string) => checksOf(variant).filter((a) => a.status === 'failed');

beforeAll(async () => {
  results = await runChildVitest(
    fixture,
    { IDEM_AUDIT_SERVER_CLOCK_BUGS: serverClockBugs.join(',') },
    [],
    fixtureConfig,
  );
}, 150_000);

describe('describeStore() against a store on its own server clock, with one store-author bug', () => {
  it('passes the correct store: every check ran, none failed, none skipped (the control)', () => {
    const control = checksOf('none');
    expect(control.length).toBeGreaterThan(20);
    expect(control.filter((a) => a.status !== 'passed').map((a) => a.title)).toEqual([]);
  });

  it('catches app-clock: a store that times leases and retention with the application clock', () => {
    // Was a defect: describeStore() never moves the application's clock, so a store that times leases with Date.now() passes every "by the store clock" check when its harness gives ttl.
    // packages/core/src/store.ts: "Durations are relative; a store never trusts the application's
    // wall clock"; the testkit README lists "durations measured by the store's clock" as checked, and
    // the duration check is titled "... by the store clock". With a `ttl` harness the suite only
    // compares the TTL to the lease right after the call, on a machine where the app's clock and
    // the server's agree, so `expires_at = new Date(Date.now() + leaseMs)` passes. A 30 s fast app
    // server then holds every lease 30 s longer (and a slow one loses it before it ends). Expected:
    // a check that skews the application's clock (vi.setSystemTime / a Date.now offset) around
    // claim, renew and complete and still finds the TTLs the durations given.
    expect(checksOf('app-clock').length).toBeGreaterThan(20);
    expect(failedChecks('app-clock').length).toBeGreaterThan(0);
  });

  it("catches complete-keeps-longer-expiry: a completion that keeps the claim's keep when the retention is shorter", () => {
    // Was a defect: describeStore() checks an outcome's retention only on a claim without keepAfterLeaseMs, so complete() keeping GREATEST(old expiry, now + retentionMs) passes.
    // The contract: "A completed record lives `retentionMs`". The engine claims with
    // keepAfterLeaseMs = its retention (24 h) and an outcome policy may store an outcome for less
    // ({ store: true, retention: '1m' } for a 5xx): such a store replays that 5xx for a day.
    // Expected: claim with a keep longer than the retention, complete, ttl about retentionMs.
    expect(checksOf('complete-keeps-longer-expiry').length).toBeGreaterThan(20);
    expect(failedChecks('complete-keeps-longer-expiry').length).toBeGreaterThan(0);
  });
});

// The two bugs are real contract violations, shown on the store directly (these pass).
describe('what the bugs the suite misses do', () => {
  const response = { status: 503, headers: {}, body: new Uint8Array([1]) };

  it('app-clock: an application clock 30 s fast makes a 10 s lease last 40 s by the server clock', async () => {
    const harness = serverClockHarness('app-clock');
    const realNow = Date.now;
    Date.now = () => realNow() + 30_000;
    try {
      await harness.store.claim({ id: 'k', token: 't', fingerprint: 'fp', leaseMs: 10_000 });
    } finally {
      Date.now = realNow;
    }
    expect(await harness.ttl?.('k')).toBeGreaterThan(39_000);
    const correct = serverClockHarness();
    Date.now = () => realNow() + 30_000;
    try {
      await correct.store.claim({ id: 'k', token: 't', fingerprint: 'fp', leaseMs: 10_000 });
    } finally {
      Date.now = realNow;
    }
    expect(await correct.ttl?.('k')).toBeLessThanOrEqual(10_000);
  });

  it('complete-keeps-longer-expiry: an outcome kept for 1 minute lives a day', async () => {
    const harness = serverClockHarness('complete-keeps-longer-expiry');
    const day = 86_400_000;
    await harness.store.claim({ id: 'k', token: 't', fingerprint: 'fp', leaseMs: 10_000, keepAfterLeaseMs: day });
    expect(await harness.store.complete({ id: 'k', token: 't', response, retentionMs: 60_000 })).toBe(true);
    expect(await harness.ttl?.('k')).toBeGreaterThan(day);
  });
});
