// A third-party store (a Map on its own clock, test/audit-support/map-store.ts), written from
// docs/stores.md and the testkit README alone, run through describeStore() with the harness the
// README documents. Without IDEM_AUDIT_STORE_BUGS this is the store author's own test file: the
// correct store must pass the whole suite, none of it skipped.
//
// With IDEM_AUDIT_STORE_BUGS=bug1,bug2 (set only by describe-store-bugs.audit.test.ts, which runs
// this file in a child vitest), it runs the suite once per named bug, as `bug=<name>`, and once
// on the correct store as `bug=none`, so the parent can read which bugs the suite noticed.
import { describeStore } from '@idem/testkit';
import { mapStoreHarness, type StoreBug, storeBugs } from './audit-support/map-store.js';

const requested = process.env.IDEM_AUDIT_STORE_BUGS;

if (requested === undefined) {
  describeStore('a third-party Map store written from the docs', async () => mapStoreHarness());
} else {
  describeStore('bug=none', async () => mapStoreHarness());
  for (const name of requested.split(',').filter(Boolean)) {
    if (!(storeBugs as readonly string[]).includes(name)) throw new Error(`unknown store bug ${name}`);
    describeStore(`bug=${name}`, async () => mapStoreHarness(name as StoreBug));
  }
}
