import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

const packages = ['core', 'testkit', 'redis', 'postgres', 'guard', 'webhooks', 'client', 'express', 'fastify', 'koa'];

// Tests import the packages by name; point each name at its source so no build is needed first.
const alias = Object.fromEntries(
  packages.map((name) => [`@idem/${name}`, fileURLToPath(new URL(`./packages/${name}/src/index.ts`, import.meta.url))]),
);

const reliability = 'packages/testkit/test/reliability/**/*.int.test.ts';

export default defineConfig({
  resolve: { alias },
  test: {
    projects: [
      {
        resolve: { alias },
        test: {
          name: 'unit',
          include: ['packages/*/test/**/*.test.ts', 'examples/*/test/**/*.test.ts', 'scripts/test/**/*.test.ts'],
          exclude: ['**/*.int.test.ts', '**/*.e2e.test.ts', '**/node_modules/**'],
          testTimeout: 20_000,
          // A PGlite store started in beforeAll compiles its WebAssembly first: seconds on a busy box.
          hookTimeout: 30_000,
          // Unit files wait more than they compute (PGlite starts, child processes, sockets): on 2
          // cores, 3 workers keep both busy and take the project from about 180 s to 105 s, where
          // the default left a core idle. Their clocks are injected, so the extra worker costs no
          // timing margin.
          maxWorkers: 3,
        },
      },
      {
        resolve: { alias },
        test: {
          name: 'integration',
          include: [
            'packages/*/test/**/*.int.test.ts',
            'examples/*/test/**/*.int.test.ts',
            'examples/*/test/**/*.e2e.test.ts',
            'packages/*/test/**/*.e2e.test.ts',
            'examples/test/**/*.int.test.ts',
            'docs/test/**/*.test.ts',
            'benchmarks/test/**/*.int.test.ts',
          ],
          exclude: [reliability, '**/node_modules/**'],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          // Integration files share real Redis and PostgreSQL; keep the pressure on a 2-core box sane.
          maxWorkers: 2,
          // Unit tests run first, then these; vitest 4 needs distinct groups for distinct maxWorkers.
          sequence: { groupOrder: 1 },
        },
      },
      {
        resolve: { alias },
        test: {
          // The fault-injection scenarios time leases of a few hundred milliseconds across worker
          // processes: run last, one file at a time, so no other test file starves their heartbeats.
          name: 'reliability',
          include: [reliability],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          maxWorkers: 1,
          // Within a file, independent scenarios (one per store, each with its own workers and keys)
          // run at once and start together (support.ts, startTogether): every one of them must be
          // let in at once, or those started would wait for the others' start-up forever. The most
          // in one file is six (store-slow.int.test.ts).
          maxConcurrency: 8,
          sequence: { groupOrder: 2 },
        },
      },
    ],
  },
});
