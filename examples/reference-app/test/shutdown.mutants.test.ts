// Tests written by a mutation-testing pass over drain.ts and shutdown.ts: each kills a mutant the
// other tests let live (named in its comment).
import { createServer } from 'node:http';
import { describe, expect, it } from 'vitest';
import { drainable } from '../src/drain.js';
import { closeInOrder } from '../src/shutdown.js';

describe('shutdown (mutants)', () => {
  // Kills: closeInOrder throwing only when more than one step failed.
  it('closeInOrder rejects when a single step failed', async () => {
    const steps = [
      { name: 'gateway', close: async () => undefined },
      {
        name: 'database',
        close: async () => {
          throw new Error('stuck');
        },
      },
    ];
    await expect(closeInOrder(steps)).rejects.toThrow('shutdown: closing database failed');
  });

  // Kills: drain.close() resolving whatever server.close() reports.
  it("drain.close() rejects with server.close()'s error (a server that is not listening)", async () => {
    await expect(drainable(createServer()).close(0)).rejects.toMatchObject({ code: 'ERR_SERVER_NOT_RUNNING' });
  });
});
