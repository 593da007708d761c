// describeAdapter()'s `adapterOptions` are laid over the table's own settings (its store, its event
// listener). A setting given there as undefined is left out, as everywhere in idem: it must not
// replace the table's store or listener with nothing, which failed every scenario (no store) or left
// the ones that wait for an event waiting out their timeout (no listener).
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { fixtureConfig, runChildVitest } from './audit-support/child-vitest.js';

const fixture = join(dirname(fileURLToPath(import.meta.url)), 'audit-support', 'adapter-options-undefined.fixture.ts');

describe('describeAdapter() with adapterOptions given as undefined', () => {
  it("keeps the table's store and event listener", async () => {
    // One scenario that needs the store, one that waits for an event.
    const results = await runChildVitest(
      fixture,
      {},
      ['-t', 'first execution: the handler status|first still running: 409'],
      fixtureConfig,
    );
    const ran = results
      .filter((result) => result.status !== 'skipped' && result.status !== 'pending')
      .map((result) => [result.ancestorTitles[0], result.title.slice(0, 24), result.status]);
    expect(ran).toEqual([
      ['Adapter scenarios: store left out', 'first execution: the han', 'passed'],
      ['Adapter scenarios: store left out', 'first still running: 409', 'passed'],
      ['Adapter scenarios: listener left out', 'first execution: the han', 'passed'],
      ['Adapter scenarios: listener left out', 'first still running: 409', 'passed'],
    ]);
  }, 120_000);
});
