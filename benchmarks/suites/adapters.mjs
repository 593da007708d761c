// Per framework: the bare POST /charges, idem on memoryStore, Redis and PostgreSQL with fresh keys,
// replays and a hot key, and on Express the peers on the same stores. One group per framework, so
// every ratio (idem over bare, idem over a peer) comes from contenders measured in the same rounds.
import { measureServer } from '../lib/measure-http.mjs';
import { runGroup } from '../lib/rounds.mjs';

const patterns = [
  ['fresh', 'fresh keys'],
  ['replay', 'replays'],
  ['hot', 'hot key'],
];
const stores = [
  ['memory', 'memoryStore'],
  ['redis', 'Redis'],
  ['postgres', 'PostgreSQL'],
];
// Where idem sits in each framework's route, as its guide mounts it; the yardstick layers sit there too.
const mountNote = {
  express:
    'idem is mounted before express.json(), as the Express guide has it: it reads the raw body and hands it back, and the parser reads it again; the minimal and calibration layers sit in the same place, the peers after the parser.',
  fastify:
    "idem is the plugin, registered before the route: it fingerprints the value Fastify's parser made of a JSON body, so the body is read once.",
  koa: 'idem is mounted before the route, which reads the body itself (node:stream/consumers): idem reads the raw body and hands it back, and the route reads it again.',
};

const frameworkNames = { express: 'Express', fastify: 'Fastify', koa: 'Koa' };

/** The `replayCache.ttl` of the rows that measure it on the shared stores. */
const replayCacheTtl = '1s';

/** The busy work per request of the calibration row (servers/calibration-layer.mjs), in µs. */
export const calibrationMicros = 5;

/** Contender names, shared with the targets so a renamed row cannot silently drop a target. */
export const adapterRow = {
  bare: 'bare route',
  idem: (store, pattern) => `idem, ${storeLabel(store)}, ${patternLabel(pattern)}`,
  idemCached: (store, pattern) => `idem, ${storeLabel(store)}, ${patternLabel(pattern)}, replayCache ${replayCacheTtl}`,
  peer: (peer, store, pattern) => `${peer}, ${storeLabel(store)}, ${patternLabel(pattern)}`,
  minimal: (pattern) => `minimal layer (a Map, no hashing), ${patternLabel(pattern)}`,
  calibration: `bare route + ${calibrationMicros} µs of busy work (calibration)`,
};

/** Peers measured on Express, with the stores they publish an adapter for. */
export const expressPeers = [
  { variant: 'express-idempotency', label: 'express-idempotency', stores: ['memory', 'redis'] },
  { variant: 'node-idempotency', label: '@node-idempotency/core', stores: ['memory', 'redis'] },
];

function storeLabel(store) {
  return stores.find(([id]) => id === store)[1];
}
function patternLabel(pattern) {
  return patterns.find(([id]) => id === pattern)[1];
}

const hotKeyNote =
  'Hot key: all connections share one key for 500 requests, then the next key (one execution per key; duplicates in flight get 409, later ones replays; 409s count as answers).';
const otherFrameworkPeers =
  'The idem Redis rows run on a node-redis client. No peer is measured on this framework: express-idempotency is Express-only, and @node-idempotency has no published Fastify or Koa wrapper (the npm registry answers 404 for @node-idempotency/fastify).';
const peersNote = {
  express:
    'The idem Redis rows run on a node-redis client, like the Redis adapters of the peers. Peers run with the usage their READMEs show. @node-idempotency/core is wired as its README describes (onRequest, onResponse): its Express wrapper is not published on npm. Neither peer has a PostgreSQL adapter.',
  fastify: otherFrameworkPeers,
  koa: otherFrameworkPeers,
};

const yardstickNote = `The minimal layer is a yardstick, not a peer (servers/minimal-layer.mjs): a Map from the raw key to the first response and a Set of keys in flight, mounted where idem is, with no scope, fingerprint, hashing, lease, expiry or bound. A layer that does what the spec asks, mounted in the same place, costs at least what it costs. The calibration row is the bare route with ${calibrationMicros} µs of busy work per request where idem is mounted (servers/calibration-layer.mjs): what a layer of exactly that cost does to the ratio on this machine, which the #4 explanations use to read ratios as µs of added work.`;

const replayCacheNote = `The rows marked "replayCache ${replayCacheTtl}" run idem with \`replayCache: { ttl: '${replayCacheTtl}' }\`: each server answers repeats of a completed key from memory for that long, then reads the store again.`;

const post = (pattern) => ({ pattern, method: 'POST', path: '/charges' });

/**
 * The adapters suite: one group per framework.
 *
 * @example
 * const { groups } = await adaptersSuite.run(settings, context);
 */
export const adaptersSuite = {
  id: 'adapters',
  title: 'Adapters: bare route, idem per store, peers (Express, Fastify, Koa)',
  async run(settings, context) {
    const groups = [];
    const frameworks = settings.quick ? ['express'] : ['express', 'fastify', 'koa'];
    for (const framework of frameworks) {
      const contenders = [
        {
          name: adapterRow.bare,
          quick: true,
          measure: () => measureServer({ kind: 'charges', framework, variant: 'bare' }, post('none'), settings),
        },
      ];
      for (const [store] of stores) {
        for (const [pattern] of patterns) {
          contenders.push({
            name: adapterRow.idem(store, pattern),
            quick: store === 'memory' && pattern !== 'hot',
            unavailable: context.unavailable(store),
            measure: () =>
              measureServer({ kind: 'charges', framework, variant: 'idem', store }, post(pattern), settings),
          });
        }
      }
      // A shared store's replays with the local cache of completed outcomes (`replayCache`): what a
      // hot key costs when its repeats are answered without a round trip.
      for (const [store] of stores.filter(([id]) => id !== 'memory')) {
        for (const [pattern] of patterns.filter(([id]) => id !== 'fresh')) {
          contenders.push({
            name: adapterRow.idemCached(store, pattern),
            quick: false,
            unavailable: context.unavailable(store),
            measure: () =>
              measureServer(
                { kind: 'charges', framework, variant: 'idem', store, replayCache: replayCacheTtl },
                post(pattern),
                settings,
              ),
          });
        }
      }
      // The yardstick of servers/minimal-layer.mjs: the least an idempotency layer in idem's place costs.
      for (const [pattern] of patterns.filter(([id]) => id !== 'hot')) {
        contenders.push({
          name: adapterRow.minimal(pattern),
          quick: false,
          measure: () => measureServer({ kind: 'charges', framework, variant: 'minimal' }, post(pattern), settings),
        });
      }
      contenders.push({
        name: adapterRow.calibration,
        quick: false,
        measure: () =>
          measureServer(
            { kind: 'charges', framework, variant: 'calibration', spinMicros: calibrationMicros },
            post('none'),
            settings,
          ),
      });
      if (framework === 'express') {
        for (const peer of expressPeers) {
          for (const [store] of stores) {
            for (const [pattern] of patterns.filter(([id]) => id !== 'hot')) {
              const supported = peer.stores.includes(store);
              contenders.push({
                name: adapterRow.peer(peer.label, store, pattern),
                quick: store === 'memory' && pattern === 'fresh' && peer.variant === 'express-idempotency',
                unavailable: supported
                  ? context.unavailable(store)
                  : `${peer.label} publishes no ${storeLabel(store)} adapter`,
                measure: () =>
                  measureServer({ kind: 'charges', framework, variant: peer.variant, store }, post(pattern), settings),
              });
            }
          }
        }
      }
      groups.push(
        await runGroup(
          {
            id: `adapters-${framework}`,
            title: `${frameworkNames[framework]}: POST /charges`,
            unit: 'req/s',
            baseline: adapterRow.bare,
            note: [mountNote[framework], hotKeyNote, replayCacheNote, peersNote[framework], yardstickNote].join(' '),
            contenders,
          },
          settings,
          context.log,
        ),
      );
    }
    const notMeasured = frameworks
      .filter((framework) => framework !== 'express')
      .map((framework) => ({
        scenario: `${frameworkNames[framework]}: peers (express-idempotency, @node-idempotency)`,
        reason:
          'express-idempotency is Express middleware only; @node-idempotency/fastify and a Koa wrapper are not published on npm',
      }));
    return { groups, notMeasured };
  },
};
