// The per-request overhead of the idempotency adapters on memoryStore (issue 4's target), per
// framework: the bare POST /charges, idem with fresh keys, idem replays, and as yardsticks the
// minimal layer of servers/minimal-layer.mjs and the calibration of servers/calibration-layer.mjs
// (the bare route with a known amount of busy work per request). Each server runs in a process of
// its own (servers/serve.mjs, as in `npm run bench`) and lives for the whole run, so every window
// after the first finds it warm; the load comes from this process.
// Contenders alternate within every round (A B C, then C B A, ...), so a ratio compares samples
// taken minutes apart at most. Besides throughput, the server reports the CPU time it spent, which
// is what the adapters cost per request whatever the client's speed.
//
//   node benchmarks/adapters-overhead.bench.mjs [--rounds 3] [--duration 3] [--connections 16]
//        [--frameworks express,fastify,koa]
//        [--only bare,fresh,replay,minimal-fresh,minimal-replay,calibration]
//        [--profile dir] [--no-build]
//
// --only keeps some contenders (to profile one path; default bare,fresh,replay); --profile writes
// a --cpu-prof profile of each server into dir. The servers run the built packages on plain Node,
// as benchmarks/run.mjs does (it builds first when a dist is stale, and so does this file, unless
// --no-build).
//
// Human lines first; the last line is one JSON object for benchmarks/run.mjs:
//   { "benchmark": "adapters-overhead", "results": [{ "name", "opsPerSecond", "ratio", ... }] }
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { ensureBuilt } from './lib/built.mjs';
import { startChild } from './lib/child-process.mjs';
import { chargeBody, drive, primeReplay, trafficHeaders } from './lib/http-load.mjs';
import { withServerCpu } from './lib/measure-http.mjs';
import { summarize } from './lib/stats.mjs';
import { calibrationMicros } from './suites/adapters.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));

// Every contender --only may name: which server it drives, and with which traffic.
const contenderKinds = {
  bare: { server: 'bare', pattern: 'none', label: 'bare route' },
  fresh: { server: 'idem', pattern: 'fresh', label: 'idem fresh keys' },
  replay: { server: 'idem', pattern: 'replay', label: 'idem replays' },
  'minimal-fresh': { server: 'minimal', pattern: 'fresh', label: 'minimal layer fresh keys' },
  'minimal-replay': { server: 'minimal', pattern: 'replay', label: 'minimal layer replays' },
  calibration: { server: 'calibration', pattern: 'none', label: `bare route + ${calibrationMicros} µs busy work` },
};
const servers = {
  bare: { variant: 'bare' },
  idem: { variant: 'idem', store: 'memory' },
  minimal: { variant: 'minimal' },
  calibration: { variant: 'calibration', spinMicros: calibrationMicros },
};

await main();

async function main() {
  const { values } = parseArgs({
    options: {
      'no-build': { type: 'boolean', default: false },
      rounds: { type: 'string', default: '3' },
      duration: { type: 'string', default: '3' },
      connections: { type: 'string', default: '16' },
      frameworks: { type: 'string', default: 'express,fastify,koa' },
      profile: { type: 'string' },
      only: { type: 'string', default: 'bare,fresh,replay' },
    },
  });
  const rounds = positive(values.rounds, 'rounds');
  const seconds = positive(values.duration, 'duration');
  const connections = positive(values.connections, 'connections');
  const frameworks = values.frameworks.split(',').map((name) => name.trim());
  // --only leaves contenders out (to profile one path); the first one left is the ratios' base.
  const only = values.only.split(',').map((name) => name.trim());
  const unknown = only.filter((id) => !(id in contenderKinds));
  if (unknown.length > 0) {
    throw new TypeError(`--only names ${unknown.join(', ')}; choose from ${Object.keys(contenderKinds).join(', ')}`);
  }
  if (!values['no-build']) ensureBuilt(root);
  const execArgv = values.profile ? ['--cpu-prof', `--cpu-prof-dir=${resolve(values.profile)}`] : [];

  const results = [];
  for (const framework of frameworks) {
    const started = new Map();
    try {
      // Only the servers some contender drives are started.
      for (const name of new Set(only.map((id) => contenderKinds[id].server))) {
        started.set(
          name,
          await startChild('serve.mjs', { kind: 'charges', framework, ...servers[name] }, { execArgv }),
        );
      }
      // The replayed key is completed once on every server some replay contender drives.
      const replayKey = `replay-${randomUUID()}`;
      const replayed = new Set(
        only.filter((id) => contenderKinds[id].pattern === 'replay').map((id) => contenderKinds[id].server),
      );
      for (const [name, server] of started) {
        if (!replayed.has(name)) continue;
        await primeReplay(`http://127.0.0.1:${server.message.port}/charges`, replayKey).catch((error) => {
          throw new Error(`${framework}: ${error.message}`);
        });
      }
      const contenders = only.map((id) => {
        const kind = contenderKinds[id];
        return { name: `${framework}, ${kind.label}`, server: started.get(kind.server), pattern: kind.pattern };
      });
      const window = async (contender, duration) => {
        const startedAt = process.hrtime.bigint();
        const {
          result: load,
          cpuMicros,
          systemMicros,
        } = await withServerCpu(contender.server, () =>
          drive({
            url: `http://127.0.0.1:${contender.server.message.port}/charges`,
            method: 'POST',
            body: chargeBody,
            headers: trafficHeaders({ pattern: contender.pattern, replayKey }),
            seconds: duration,
            connections,
          }),
        );
        const elapsed = Number(process.hrtime.bigint() - startedAt) / 1e9;
        return {
          opsPerSecond: load.requestsPerSecond,
          cpuMicrosPerRequest: cpuMicros / load.requests,
          systemMicrosPerRequest: systemMicros / load.requests,
          cpuShare: cpuMicros / 1e6 / elapsed,
        };
      };
      for (const contender of contenders) await window(contender, 1); // warm-up: JIT, pools
      const samples = new Map(contenders.map((contender) => [contender.name, []]));
      for (let round = 0; round < rounds; round++) {
        const order = round % 2 === 0 ? contenders : [...contenders].reverse();
        const taken = new Map();
        for (const contender of order) taken.set(contender.name, await window(contender, seconds));
        const base = taken.get(contenders[0].name);
        for (const contender of contenders) {
          const sample = taken.get(contender.name);
          samples.get(contender.name).push({
            ...sample,
            ratio: sample.opsPerSecond / base.opsPerSecond,
            cpuRatio: base.cpuMicrosPerRequest / sample.cpuMicrosPerRequest,
          });
          console.log(
            `round ${round + 1} ${contender.name.padEnd(36)} ${String(sample.opsPerSecond).padStart(7)} req/s` +
              `  ${sample.cpuMicrosPerRequest.toFixed(1).padStart(6)} µs CPU/req (${sample.systemMicrosPerRequest.toFixed(1)} in the kernel)  (server ${(sample.cpuShare * 100).toFixed(0)}% of a core)`,
          );
        }
      }
      for (const contender of contenders) {
        const taken = samples.get(contender.name);
        const middle = (field) => summarize(taken.map((sample) => sample[field])).median;
        const result = {
          name: contender.name,
          opsPerSecond: middle('opsPerSecond'),
          ratio: round3(middle('ratio')),
          cpuMicrosPerRequest: round3(middle('cpuMicrosPerRequest')),
          cpuRatio: round3(middle('cpuRatio')),
        };
        results.push(result);
        console.log(
          `${result.name.padEnd(36)} median ${String(result.opsPerSecond).padStart(7)} req/s, ratio ${result.ratio.toFixed(2)};` +
            ` ${result.cpuMicrosPerRequest.toFixed(1)} µs CPU/req, CPU ratio ${result.cpuRatio.toFixed(2)}`,
        );
      }
    } finally {
      for (const server of started.values()) await server.stop();
    }
  }
  console.log(
    'ratio: throughput over the first contender of the same round; cpuRatio: its CPU per request over this one (1 = no overhead).',
  );
  console.log(JSON.stringify({ benchmark: 'adapters-overhead', results }));
}

function positive(text, name) {
  const value = Number(text);
  if (!Number.isFinite(value) || value <= 0) throw new TypeError(`--${name} must be a positive number`);
  return value;
}

function round3(value) {
  return Math.round(value * 1000) / 1000;
}
