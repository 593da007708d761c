// One HTTP measurement: start the server in its own process, warm it up, drive it for the window,
// stop it. A fresh process per measurement means no contender inherits another's heap or records.
import { randomUUID } from 'node:crypto';
import { startChild } from './child-process.mjs';
import { chargeBody, drive, primeReplay, trafficHeaders } from './http-load.mjs';

/**
 * Measures the server `spec` under `traffic` and resolves with `{ value: requests per second,
 * details: { statuses, latencyP99Ms, cpuMicrosPerRequest } }`; `traffic` is
 * `{ pattern: 'none'|'fresh'|'replay'|'hot'|'tokens', method, path, tokens? }`.
 *
 * @example
 * const { value } = await measureServer({ kind: 'node-http' }, { pattern: 'none', method: 'POST', path: '/charges' }, settings);
 */
export async function measureServer(spec, traffic, settings) {
  const keyPrefix = `idem-bench-key:${randomUUID()}:`;
  const server = await startChild('serve.mjs', { ...spec, keyPrefix });
  try {
    const url = `http://127.0.0.1:${server.message.port}${traffic.path}`;
    const post = traffic.method === 'POST';
    const replayKey = `${keyPrefix}replayed`;
    const body = traffic.body ?? chargeBody;
    // A server may hand out the bearer token its own issuer signed (the reference app does).
    const bearer = traffic.bearer ?? server.message.bearer;
    const authorization = bearer === undefined ? {} : { authorization: `Bearer ${bearer}` };
    if (traffic.pattern === 'replay') {
      // The one execution of the replayed key happens before the window; every request after is a replay.
      await primeReplay(url, replayKey, { body, headers: authorization });
    }
    // A hot key's duplicates in flight get 409 (idem, express-idempotency) by design: accepted there.
    const accept =
      traffic.pattern === 'hot' ? (status) => (status >= 200 && status < 300) || status === 409 : undefined;
    const window = (extra) =>
      drive({
        url,
        method: traffic.method,
        ...(post ? { body } : {}),
        headers: trafficHeaders({ pattern: traffic.pattern, keyPrefix, replayKey, tokens: traffic.tokens, bearer }),
        connections: settings.connections,
        ...(accept ? { accept } : {}),
        ...extra,
      });
    await window({ seconds: settings.warmupSeconds });
    // The server's CPU time over the window, per request: what the code under test costs, whatever
    // the load generator on the other core could offer (a throughput ratio mixes in both).
    const { result: measured, cpuMicros } = await withServerCpu(server, () =>
      window({ seconds: settings.durationSeconds }),
    );
    return {
      value: measured.requestsPerSecond,
      details: {
        statuses: measured.statuses,
        latencyP99Ms: measured.latencyP99Ms,
        cpuMicrosPerRequest: Math.round((cpuMicros / measured.requests) * 10) / 10,
      },
    };
  } finally {
    await server.stop();
  }
}

/**
 * Runs `work` and resolves with its result and the CPU time (µs, every thread; `systemMicros` the
 * kernel's share) that the child `server` of {@link startChild} spent meanwhile.
 *
 * @example
 * const { result, cpuMicros } = await withServerCpu(server, () => drive({ url, seconds: 2, connections: 50 }));
 */
export async function withServerCpu(server, work) {
  const before = await server.cpu();
  const result = await work();
  const after = await server.cpu();
  return {
    result,
    cpuMicros: after.cpuMicros - before.cpuMicros,
    systemMicros: after.systemMicros - before.systemMicros,
  };
}

/**
 * Runs the in-process loop `spec` (benchmarks/servers/loop.mjs) in a child and returns its ops/s.
 *
 * @example
 * const opsPerSecond = await measureLoop({ kind: 'jose', alg: 'ES256', ... }, settings);
 */
export async function measureLoop(spec, settings) {
  const child = await startChild('loop.mjs', { ...spec, durationMs: settings.durationSeconds * 1_000 });
  await child.stop();
  return child.message.opsPerSecond;
}
