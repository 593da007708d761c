// The describeAdapter() table over a tiny third-party node:http adapter (node-http-adapter.ts). Run
// only by describe-adapter-bugs.audit.test.ts, in a child vitest with fixture.vitest.config.ts and
// IDEM_AUDIT_ADAPTER_BUGS naming the tables to run: `none` (the correct adapter) and bugs. The
// tiny server is no full framework and fails some scenarios whatever the bug, which is why this is a
// fixture, not a test file of the main run.
import { describeAdapter } from '@idem/testkit';
import { type AdapterBug, adapterBugs, makeNodeHttpServer } from './node-http-adapter.js';

const requested = process.env.IDEM_AUDIT_ADAPTER_BUGS ?? '';

// `none` names the correct adapter; the parent runs each table in a child of its own, at once.
for (const name of requested.split(',').filter(Boolean)) {
  if (name === 'none') {
    describeAdapter('bug=none', (options) => makeNodeHttpServer(options));
    continue;
  }
  if (!(adapterBugs as readonly string[]).includes(name)) throw new Error(`unknown adapter bug ${name}`);
  describeAdapter(`bug=${name}`, (options) => makeNodeHttpServer(options, name as AdapterBug));
}
