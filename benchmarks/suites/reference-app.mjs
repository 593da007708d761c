// The reference app's charge, end to end on one box: the gateway verifies the bearer token, strips
// identity headers and mints an internal token; the API verifies that, authorizes charges:write,
// claims the key and writes the charge and its outbox event in one PostgreSQL transaction. Beside it,
// the bare Express route of the same rounds, as a yardstick of what the whole path costs.
import { measureServer } from '../lib/measure-http.mjs';
import { runGroup } from '../lib/rounds.mjs';

const body = JSON.stringify({ amount: 1000, currency: 'USD' });

/**
 * The reference app suite.
 *
 * @example
 * const { groups } = await referenceAppSuite.run(settings, context);
 */
export const referenceAppSuite = {
  id: 'reference-app',
  title: 'Reference app: a charge through gateway, guard, idempotency and the PostgreSQL outbox',
  async run(settings, context) {
    const unavailable = context.unavailable('postgres');
    const charge = (pattern) => ({ pattern, method: 'POST', path: '/charges', body });
    const group = await runGroup(
      {
        id: 'reference-app',
        title: 'Reference app: POST /charges through the gateway',
        unit: 'req/s',
        baseline: 'bare Express POST /charges',
        note: "Gateway (Fastify, @fastify/reply-from) and API (Express) run in one child process, as `npm start` runs them; the outbox relay is off so webhook delivery does not share the cores. One bearer token for the whole load (the gateway's verified-token cache answers after the first request).",
        contenders: [
          {
            name: 'bare Express POST /charges',
            quick: true,
            measure: () =>
              measureServer({ kind: 'charges', framework: 'express', variant: 'bare' }, charge('none'), settings),
          },
          {
            name: 'reference app charge, fresh keys',
            quick: true,
            unavailable,
            measure: () => measureServer({ kind: 'reference-app' }, charge('fresh'), settings),
          },
          {
            name: 'reference app charge, replays',
            unavailable,
            measure: () => measureServer({ kind: 'reference-app' }, charge('replay'), settings),
          },
        ],
      },
      settings,
      context.log,
    );
    return { groups: [group] };
  },
};
