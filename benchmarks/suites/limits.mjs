// The machine's limit for HTTP: bare node:http beside the three frameworks' bare routes, with the
// same POST /charges load. (redis-benchmark and pgbench, the other limits, run in the store suites,
// beside the stores they bound.)
import { measureServer } from '../lib/measure-http.mjs';
import { runGroup } from '../lib/rounds.mjs';

/** Bare node:http on research/perf-limits.md's idle box of this kind: req/s, median of its runs. */
export const referenceNodeHttp = 49_920;

/**
 * The limits suite: node:http, then bare Express, Fastify and Koa.
 *
 * @example
 * const { groups } = await limitsSuite.run(settings, context);
 */
export const limitsSuite = {
  id: 'limits',
  title: 'Limits: bare node:http beside the bare frameworks',
  async run(settings, context) {
    const traffic = { pattern: 'none', method: 'POST', path: '/charges' };
    const frameworks = ['express', 'fastify', 'koa'];
    const contenders = [
      { name: 'node:http', quick: true, measure: () => measureServer({ kind: 'node-http' }, traffic, settings) },
      ...frameworks.map((framework) => ({
        name: `bare ${framework}`,
        quick: framework === 'fastify',
        measure: () => measureServer({ kind: 'charges', framework, variant: 'bare' }, traffic, settings),
      })),
    ];
    const group = await runGroup(
      {
        id: 'limits-http',
        title: 'HTTP limit: node:http vs bare frameworks, POST /charges',
        unit: 'req/s',
        baseline: 'node:http',
        note: `research/perf-limits.md measured node:http ${(referenceNodeHttp / 1000).toFixed(1)}k, Fastify 43.7k, Koa 15.7k, Express 6.8k req/s on an idle box (Fastify/node:http 0.87, Koa 0.31, Express 0.14).`,
        contenders,
      },
      settings,
      context.log,
    );
    return { groups: [group] };
  },
};
