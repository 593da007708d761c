// The describeAdapter() table over a tiny third-party node:http adapter
// (test/audit-support/node-http-adapter.ts). Run only by describe-adapter-bugs.audit.test.ts, in a
// child vitest with IDEM_AUDIT_ADAPTER_BUGS set: once on the correct adapter (`bug=none`) and once
// per named bug. The tiny server is no full framework and fails some scenarios whatever the bug,
// so on its own (no variable) this file runs nothing.
import { describeAdapter } from '@idem/testkit';
import { it } from 'vitest';
import { type AdapterBug, adapterBugs, makeNodeHttpServer } from './audit-support/node-http-adapter.js';

const requested = process.env.IDEM_AUDIT_ADAPTER_BUGS;

if (requested === undefined) {
  it.skip('runs only under describe-adapter-bugs.audit.test.ts', () => {});
} else {
  describeAdapter('bug=none', (options) => makeNodeHttpServer(options));
  for (const name of requested.split(',').filter(Boolean)) {
    if (!(adapterBugs as readonly string[]).includes(name)) throw new Error(`unknown adapter bug ${name}`);
    describeAdapter(`bug=${name}`, (options) => makeNodeHttpServer(options, name as AdapterBug));
  }
}
