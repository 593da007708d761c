// The load generator: autocannon in the runner's process, against a server in a child process.
// Every request is built by one `setupRequest` call that adds one computed header whatever the
// scenario, so the generator does the same work on every side of a ratio and only the server differs.
import { randomUUID } from 'node:crypto';
import autocannon from 'autocannon';

/** The charge every POST scenario sends (the body of research/perf-limits.md's HTTP baselines). */
export const chargeBody = JSON.stringify({
  amount: 1000,
  currency: 'usd',
  source: 'tok_visa',
  description: 'perf test charge',
  metadata: { order_id: 'ord_123' },
});

/** Requests a hot key takes before the next key: enough for a burst of duplicates on each. */
const hotKeyRequests = 500;

/**
 * Completes `key` once on the server at `url`, before a window of replays opens, and proves that a
 * second request with it is answered from the record: the same status and the same body bytes (the
 * handler numbers every charge it makes, so a second execution would show in the body). A window
 * of "replays" that were executions would measure the wrong thing; it throws instead.
 *
 * @example
 * await primeReplay('http://127.0.0.1:3000/charges', 'replay-1');
 */
export async function primeReplay(url, key, { body = chargeBody, headers = {} } = {}) {
  const send = async () => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers },
      body,
    });
    return { status: response.status, text: await response.text() };
  };
  const first = await send();
  if (first.status !== 201) throw new Error(`priming the replayed key answered ${first.status}`);
  // A layer that answers before it has stored (express-idempotency writes after it sends) may still
  // call the key in flight for a moment: 409 is asked again, a few times, before it counts.
  let second = await send();
  for (let attempt = 1; second.status === 409 && attempt <= 20; attempt++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    second = await send();
  }
  if (second.status !== first.status || second.text !== first.text) {
    throw new Error(
      `the replayed key was not replayed: ${first.status} ${first.text.slice(0, 80)} then ${second.status} ${second.text.slice(0, 80)}`,
    );
  }
}

/**
 * Builds the per-request header of a traffic pattern:
 * - `none`: a random `x-nonce` (no key; the bare routes);
 * - `fresh`: a new Idempotency-Key per request (every request executes);
 * - `replay`: one key, completed before the window opens (every request is a replay);
 * - `hot`: all connections share one key for `hotKeyRequests` requests, then the next key (one
 *   execution per key, the duplicates in flight get 409, the later ones replays);
 * - `tokens`: `Authorization: Bearer` cycling through `tokens`.
 *
 * @example
 * const next = trafficHeaders({ pattern: 'fresh', keyPrefix: 'k-' });
 * next(); // { 'idempotency-key': 'k-5b0c…' }
 */
export function trafficHeaders({ pattern, keyPrefix = '', replayKey, tokens, bearer }) {
  const keys = keyHeaders({ pattern, keyPrefix, replayKey, tokens });
  // A fixed bearer token on top of a key pattern (the reference app's charge needs both).
  if (bearer === undefined) return keys;
  return () => ({ ...keys(), authorization: `Bearer ${bearer}` });
}

function keyHeaders({ pattern, keyPrefix, replayKey, tokens }) {
  let count = 0;
  let hotKey = `${keyPrefix}${randomUUID()}`;
  switch (pattern) {
    case 'none':
      return () => ({ 'x-nonce': randomUUID() });
    case 'fresh':
      return () => ({ 'idempotency-key': `${keyPrefix}${randomUUID()}` });
    case 'replay':
      return () => ({ 'idempotency-key': replayKey, 'x-nonce': randomUUID() });
    case 'hot':
      return () => {
        if (++count % hotKeyRequests === 0) hotKey = `${keyPrefix}${randomUUID()}`;
        return { 'idempotency-key': hotKey };
      };
    case 'tokens':
      return () => ({ authorization: `Bearer ${tokens[count++ % tokens.length]}` });
    default:
      throw new TypeError(`unknown traffic pattern ${pattern}`);
  }
}

/**
 * One autocannon window against `url`. Resolves with requests per second and the status counts;
 * rejects when a request fails or a status outside `accept` comes back (a benchmark of errors
 * would measure the wrong path).
 *
 * @example
 * const { requestsPerSecond } = await drive({ url, method: 'GET', headers: () => ({}), seconds: 3, connections: 50 });
 */
export async function drive({
  url,
  method = 'GET',
  body,
  headers,
  seconds,
  amount,
  connections,
  accept = (status) => status >= 200 && status < 300,
}) {
  const result = await autocannon({
    url,
    method,
    connections,
    ...(amount === undefined ? { duration: seconds } : { amount }),
    ...(body === undefined ? {} : { body, headers: { 'content-type': 'application/json' } }),
    requests: [
      {
        setupRequest: (request) => ({ ...request, headers: { ...request.headers, ...headers() } }),
      },
    ],
  });
  const statuses = Object.fromEntries(
    Object.entries(result.statusCodeStats ?? {}).map(([status, { count }]) => [status, count]),
  );
  const refused = Object.entries(statuses).filter(([status]) => !accept(Number(status)));
  if (result.errors > 0 || result.timeouts > 0) {
    throw new Error(`${result.errors} errors and ${result.timeouts} timeouts from ${url}`);
  }
  if (refused.length > 0) {
    throw new Error(`unexpected statuses from ${url}: ${refused.map(([s, n]) => `${n} x ${s}`).join(', ')}`);
  }
  if (result.requests.total === 0) throw new Error(`no answer from ${url}`);
  return {
    requests: result.requests.total,
    requestsPerSecond: Math.round(result.requests.total / result.duration),
    statuses,
    latencyP99Ms: result.latency.p99,
  };
}
