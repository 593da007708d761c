// Function level, no HTTP: the idem engine (begin + complete on @idem/redis) beside Powertools'
// makeIdempotent with its Redis (cache) persistence layer, on the same Redis, 50 calls in flight,
// each side in a process of its own.
import { measureLoop } from '../lib/measure-http.mjs';
import { runGroup } from '../lib/rounds.mjs';

/** Contender names, shared with the targets. */
export const functionRow = {
  idem: (mode) => `idem engine on @idem/redis (node-redis), ${mode === 'fresh' ? 'fresh keys' : 'replays'}`,
  idemIoredis: (mode) => `idem engine on @idem/redis (ioredis), ${mode === 'fresh' ? 'fresh keys' : 'replays'}`,
  powertools: (mode) => `Powertools makeIdempotent on Redis, ${mode === 'fresh' ? 'fresh keys' : 'replays'}`,
};

/**
 * The function-level suite.
 *
 * @example
 * const { groups } = await functionLevelSuite.run(settings, context);
 */
export const functionLevelSuite = {
  id: 'function-level',
  title: 'Function level on Redis: idem engine vs Powertools',
  async run(settings, context) {
    const unavailable = context.unavailable('redis');
    const contenders = [];
    for (const mode of ['fresh', 'replay']) {
      contenders.push(
        {
          name: functionRow.idem(mode),
          quick: mode === 'fresh',
          unavailable,
          measure: () => measureLoop({ kind: 'idem-engine', client: 'node-redis', mode }, settings),
        },
        {
          name: functionRow.idemIoredis(mode),
          unavailable,
          measure: () => measureLoop({ kind: 'idem-engine', client: 'ioredis', mode }, settings),
        },
        {
          name: functionRow.powertools(mode),
          quick: mode === 'fresh',
          unavailable,
          measure: () => measureLoop({ kind: 'powertools', mode }, settings),
        },
      );
    }
    const group = await runGroup(
      {
        id: 'function-redis',
        title: 'Function level on Redis (50 in flight, no HTTP)',
        unit: 'calls/s',
        baseline: functionRow.idem('fresh'),
        note: 'Powertools is a Lambda library: its handler gets a Lambda-like context (remaining time) and keys on the event field `key`. Its Redis layer runs on node-redis; idem is measured on node-redis (the targets compare these) and on ioredis.',
        contenders,
      },
      settings,
      context.log,
    );
    return { groups: [group] };
  },
};
