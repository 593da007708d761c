// The config a child vitest runs a fixture with (see child-vitest.ts): the repository's aliases, and
// only the `*.fixture.ts` files of this folder, which no project of the main run picks up. A fixture
// is a suite that fails on purpose (a buggy third-party adapter under describeAdapter); it has no
// place in the main run.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';
import repository from '../../../../vitest.config.js';

export default defineConfig({
  root: fileURLToPath(new URL('../../../..', import.meta.url)),
  resolve: repository.resolve,
  test: {
    include: ['packages/testkit/test/audit-support/*.fixture.ts'],
    testTimeout: 20_000,
  },
});
