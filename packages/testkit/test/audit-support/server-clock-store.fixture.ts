// describeStore() on a store with a server clock (server-clock-store.ts), exactly as its author's
// test file would call it, once on the correct store (`variant=none`) and once per bug named in
// IDEM_AUDIT_SERVER_CLOCK_BUGS. Run only in a child vitest by store-author.audit.test.ts.
import { describeStore } from '@idem/testkit';
import { type ServerClockBug, serverClockBugs, serverClockHarness } from './server-clock-store.js';

describeStore('variant=none', async () => serverClockHarness());
for (const name of (process.env.IDEM_AUDIT_SERVER_CLOCK_BUGS ?? '').split(',').filter(Boolean)) {
  if (!(serverClockBugs as readonly string[]).includes(name)) throw new Error(`unknown store bug ${name}`);
  describeStore(`variant=${name}`, async () => serverClockHarness(name as ServerClockBug));
}
