// Audit of describeStore() from a store author's side: does the suite notice realistic bugs in a
// third-party store? The store is test/audit-support/map-store.ts (a Map on its own clock, written
// from docs/stores.md and the README), with one bug switched on at a time.
//
// How the suite is run: describeStore() registers vitest tests, and a failing one would fail this
// file, so it cannot be called here directly. Instead this file runs third-party-store.audit.test.ts
// in a child vitest (the repository's own config, the `unit` project, the JSON reporter) with
// IDEM_AUDIT_STORE_BUGS naming the bugs; that file calls describeStore() once per bug exactly as a
// store author's test file would, plus once on the correct store as a control. Each test below then
// reads whether the suite reported at least one failed check for its bug. That is the only sound
// "did the suite catch it" question: the suite is used end to end, hooks and skips included, with
// nothing of its internals imported.
//
// A bug the suite let through was a testkit defect: the tests marked "Was a defect" state what the
// suite now catches, and the last block shows, outside the suite, what each of those bugs does (so a
// reader can see it is a real one).
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { type ChildResult, runChildVitest } from './audit-support/child-vitest.js';
import { mapStore, storeBugs } from './audit-support/map-store.js';

const fixture = join(dirname(fileURLToPath(import.meta.url)), 'third-party-store.audit.test.ts');

let results: ChildResult[] = [];
const checksOf = (bug: string) => results.filter((a) => a.ancestorTitles.includes(`Store contract: bug=${bug}`));
const failedChecks = (bug: string) => checksOf(bug).filter((a) => a.status === 'failed');

beforeAll(async () => {
  results = await runChildVitest(fixture, { IDEM_AUDIT_STORE_BUGS: storeBugs.join(',') });
}, 150_000);

describe('describeStore() against a third-party store with one realistic bug', () => {
  it('passes the correct store: every check ran, none failed, none skipped (the control)', () => {
    const control = checksOf('none');
    expect(control.length).toBeGreaterThan(20);
    // Except the application-clock check, which needs a harness `ttl`: this one gives `advance`.
    const ttlOnly = "times leases and retention by the store's clock, not the application's";
    const skippedForTtl = (a: { status: string; title: string }) => a.status === 'skipped' && a.title === ttlOnly;
    expect(control.filter((a) => a.status !== 'passed' && !skippedForTtl(a)).map((a) => a.title)).toEqual([]);
  });

  // Caught, pinned so a change to the suite that stops catching them shows.
  for (const bug of [
    'racy-claim',
    'complete-ignores-token',
    'renew-ignores-state',
    'release-ignores-state',
    'forget-ignores-token',
    'wall-clock',
    'renew-drops-keep',
    'drops-status-message',
    'accepts-any-string',
  ] as const) {
    it(`catches ${bug}`, () => {
      expect(checksOf(bug).length).toBeGreaterThan(20);
      expect(failedChecks(bug).length).toBeGreaterThan(0);
    });
  }

  // Was a defect. docs/stores.md and the Store type: "`claim` is one atomic step: of N concurrent claims of
  // an absent (or expired) id, exactly one wins". The suite races claims only on a fresh id. A store
  // whose insert of a new id is conditional (DynamoDB attribute_not_exists, Mongo's unique _id) but
  // that overwrites an expired record after reading it (the usual read-modify-write) passes every
  // check, and N retries arriving after a lease or a retention ran out all run the handler.
  // Expected: a race of concurrent claims on an expired id (an ended lease and an ended retention),
  // exactly one winner.
  it('catches racy-overwrite-of-expired (a claim of an expired id that is not atomic)', () => {
    expect(checksOf('racy-overwrite-of-expired').length).toBeGreaterThan(20);
    expect(failedChecks('racy-overwrite-of-expired').length).toBeGreaterThan(0);
  });

  // Was a defect. docs/stores.md: "the store takes the record over only if it is still abandoned and still
  // holds that token". The suite never names the token of a record that is no longer abandoned: one
  // its holder renewed (a late heartbeat after a stall) or completed (a late completion, which the
  // contract allows) between the engine's claim that saw it abandoned and its takeover. A store that
  // checks only the token (`UPDATE ... WHERE id = ? AND token = ?`) passes, and runs the handler a
  // second time over a live execution or a finished one. Expected: a takeover naming the token of a
  // renewed, and of a completed, record is refused with that record.
  it('catches takeover-checks-token-only (a takeover of a record no longer abandoned)', () => {
    expect(checksOf('takeover-checks-token-only').length).toBeGreaterThan(20);
    expect(failedChecks('takeover-checks-token-only').length).toBeGreaterThan(0);
  });

  // Was a defect. docs/stores.md: each method is "compare-and-set on the fencing token where it changes a
  // record". The suite races claims against claims only; never a completion against the takeover
  // that fences it. A complete() that reads, checks the token, then writes in another round trip
  // passes: a late holder's completion and a takeover both answer true, and the takeover's
  // execution runs and its record is overwritten under it. Expected: a race of an abandoned
  // record's late complete() with a takeover naming its token, exactly one of them succeeding.
  it('catches racy-complete (a completion that is not one compare-and-set)', () => {
    expect(checksOf('racy-complete').length).toBeGreaterThan(20);
    expect(failedChecks('racy-complete').length).toBeGreaterThan(0);
  });

  // Was a defect (the report, not the verdict). The README: the suites report failures as vitest
  // assertions, and each check's title names the rule. A release() that deletes a completed record
  // (it checks the token, not the state) is caught, but only by 'completes once, then replays the
  // stored response to every later claim', with 'expected true to be false' and no word of
  // release: the author is sent to look at complete() and claim(). Expected: the failed check's
  // title or message names release (an assertion message such as
  // `expect(..., 'release of a completed record').toBe(false)`, or a check of its own).
  it('names release() when the rule release() broke is reported', () => {
    const failed = failedChecks('release-ignores-state');
    expect(failed.length).toBeGreaterThan(0);
    const said = failed.map((a) => `${a.title}\n${a.failureMessages.map((m) => m.split('\n')[0]).join('\n')}`);
    expect(said.some((text) => /release/i.test(text))).toBe(true);
  });
});

// What the three bugs the suite let through do, shown on the store directly (these pass: they
// prove the bugs are real contract violations, not matters of taste).
describe('what the bugs the suite misses do', () => {
  const clocked = (bug: Parameters<typeof mapStore>[0]['bug']) => {
    const clock = { now: 1_000_000 };
    return { clock, store: mapStore({ now: () => clock.now, bug }) };
  };

  it('racy-overwrite-of-expired: every one of 20 claims of an expired id wins', async () => {
    const { clock, store } = clocked('racy-overwrite-of-expired');
    await store.claim({ id: 'k', token: 'old', fingerprint: 'fp', leaseMs: 1_000 });
    clock.now += 1_000;
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => store.claim({ id: 'k', token: `t${i}`, fingerprint: 'fp', leaseMs: 1_000 })),
    );
    expect(results.filter((r) => r.claimed)).toHaveLength(20);
  });

  it('takeover-checks-token-only: a takeover overwrites a record its holder completed, and one it renewed', async () => {
    const { clock, store } = clocked('takeover-checks-token-only');
    const claim = { fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 60_000 };
    await store.claim({ id: 'done', token: 'a', ...claim });
    clock.now += 1_000; // abandoned: the engine's claim sees it and will name its token
    expect(
      await store.complete({
        id: 'done',
        token: 'a',
        response: { status: 201, headers: {}, body: new Uint8Array([1]) },
        retentionMs: 60_000,
      }),
    ).toBe(true); // the late holder's completion, which the contract allows
    expect(await store.claim({ id: 'done', token: 'b', replaces: 'a', ...claim })).toEqual({ claimed: true });
    expect((await store.get('done'))?.state).toBe('in_progress'); // the stored outcome is gone; the handler runs again

    await store.claim({ id: 'alive', token: 'a', ...claim });
    clock.now += 1_000;
    expect(await store.renew({ id: 'alive', token: 'a', leaseMs: 1_000 })).toBe(true); // its holder is alive
    expect(await store.claim({ id: 'alive', token: 'b', replaces: 'a', ...claim })).toEqual({ claimed: true });
  });

  it('racy-complete: a late completion and the takeover that fences it both succeed', async () => {
    const { clock, store } = clocked('racy-complete');
    const claim = { fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 60_000 };
    await store.claim({ id: 'k', token: 'a', ...claim });
    clock.now += 1_000;
    const [completed, takeover] = await Promise.all([
      store.complete({
        id: 'k',
        token: 'a',
        response: { status: 201, headers: {}, body: new Uint8Array([1]) },
        retentionMs: 60_000,
      }),
      store.claim({ id: 'k', token: 'b', replaces: 'a', ...claim }),
    ]);
    expect([completed, takeover.claimed]).toEqual([true, true]);
  });
});
