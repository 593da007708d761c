// The per-request overhead of the idempotency adapters on memoryStore (issue 4's target), per
// framework: the bare POST /charges, idem with fresh keys, idem replays. Each server runs in a
// process of its own (this file, re-run as a child); the load comes from this process.
// Contenders alternate within every round (A B C, then C B A, ...), so a ratio compares samples
// taken minutes apart at most. Besides throughput, the server reports the CPU time it spent, which
// is what the adapters cost per request whatever the client's speed.
//
//   node benchmarks/adapters-overhead.bench.mjs [--rounds 3] [--duration 3] [--connections 16]
//        [--frameworks express,fastify,koa] [--only bare,fresh,replay] [--profile dir]
//
// --only keeps some contenders (to profile one path); --profile writes a --cpu-prof profile of each
// server into dir. The servers run the built packages on plain Node, as benchmarks/run.mjs does (it
// builds first when a dist is stale, and so does this file).
//
// Human lines first; the last line is one JSON object for benchmarks/run.mjs:
//   { "benchmark": "adapters-overhead", "results": [{ "name", "opsPerSecond", "ratio", ... }] }
import { fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const self = fileURLToPath(import.meta.url);
const root = fileURLToPath(new URL('..', import.meta.url));

if (process.env.IDEM_OVERHEAD_SERVER === '1') await serve();
else {
  (await import('./lib/built.mjs')).ensureBuilt(root);
  await main();
}

// --- server child ---------------------------------------------------------------------------

async function serve() {
  const { startCharges } = await import('./servers/charges.mjs');
  const spec = JSON.parse(process.env.IDEM_OVERHEAD_SPEC ?? '{}');
  const server = await startCharges(spec);
  process.on('message', async (message) => {
    if (message === 'cpu') {
      const { user, system } = process.cpuUsage();
      process.send({ cpuMicros: user + system, systemMicros: system });
    } else if (message === 'stop') {
      await server.close();
      // Leaving through the event loop (not process.exit) lets --cpu-prof write its profile.
      process.disconnect();
    }
  });
  process.send({ port: server.port });
}

// --- runner -----------------------------------------------------------------------------------

async function main() {
  const { values } = parseArgs({
    options: {
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
  const { drive, chargeBody, trafficHeaders } = await import('./lib/http-load.mjs');

  const results = [];
  for (const framework of frameworks) {
    const bare = await startServer({ kind: 'charges', framework, variant: 'bare' }, values.profile);
    const idem = await startServer({ kind: 'charges', framework, variant: 'idem', store: 'memory' }, values.profile);
    try {
      const replayKey = `replay-${randomUUID()}`;
      const first = await fetch(`http://127.0.0.1:${idem.port}/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': replayKey },
        body: chargeBody,
      });
      await first.arrayBuffer();
      if (first.status !== 201) throw new Error(`${framework}: the replayed request answered ${first.status}`);
      // --only leaves contenders out (to profile one path); the first one left is the ratios' base.
      const only = values.only.split(',').map((name) => name.trim());
      const contenders = [
        { id: 'bare', name: `${framework}, bare route`, server: bare, pattern: 'none' },
        { id: 'fresh', name: `${framework}, idem fresh keys`, server: idem, pattern: 'fresh' },
        { id: 'replay', name: `${framework}, idem replays`, server: idem, pattern: 'replay' },
      ].filter((contender) => only.includes(contender.id));
      if (contenders.length === 0) throw new TypeError('--only names none of bare, fresh, replay');
      const window = async (contender, duration) => {
        const headers = trafficHeaders({ pattern: contender.pattern, replayKey });
        const before = await contender.server.cpu();
        const started = process.hrtime.bigint();
        const load = await drive({
          url: `http://127.0.0.1:${contender.server.port}/charges`,
          method: 'POST',
          body: chargeBody,
          headers,
          seconds: duration,
          connections,
        });
        const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
        const after = await contender.server.cpu();
        const cpu = after.cpuMicros - before.cpuMicros;
        const requests = load.requestsPerSecond * duration;
        return {
          opsPerSecond: load.requestsPerSecond,
          cpuMicrosPerRequest: cpu / requests,
          systemMicrosPerRequest: (after.systemMicros - before.systemMicros) / requests,
          cpuShare: cpu / 1e6 / elapsed,
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
            `round ${round + 1} ${contender.name.padEnd(28)} ${String(sample.opsPerSecond).padStart(7)} req/s` +
              `  ${sample.cpuMicrosPerRequest.toFixed(1).padStart(6)} µs CPU/req (${sample.systemMicrosPerRequest.toFixed(1)} in the kernel)  (server ${(sample.cpuShare * 100).toFixed(0)}% of a core)`,
          );
        }
      }
      for (const contender of contenders) {
        const taken = samples.get(contender.name);
        const result = {
          name: contender.name,
          opsPerSecond: median(taken.map((s) => s.opsPerSecond)),
          ratio: round3(median(taken.map((s) => s.ratio))),
          cpuMicrosPerRequest: round3(median(taken.map((s) => s.cpuMicrosPerRequest))),
          cpuRatio: round3(median(taken.map((s) => s.cpuRatio))),
        };
        results.push(result);
        console.log(
          `${result.name.padEnd(28)} median ${String(result.opsPerSecond).padStart(7)} req/s, ratio ${result.ratio.toFixed(2)};` +
            ` ${result.cpuMicrosPerRequest.toFixed(1)} µs CPU/req, CPU ratio ${result.cpuRatio.toFixed(2)}`,
        );
      }
    } finally {
      await bare.stop();
      await idem.stop();
    }
  }
  console.log(
    'ratio: throughput over the bare route of the same round; cpuRatio: bare CPU per request over this one (1 = no overhead).',
  );
  console.log(JSON.stringify({ benchmark: 'adapters-overhead', results }));
}

function startServer(spec, profileDir) {
  const execArgv = [];
  if (profileDir) execArgv.push('--cpu-prof', `--cpu-prof-dir=${profileDir}`);
  const child = fork(self, [], {
    cwd: root,
    execArgv,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: {
      ...process.env,
      NODE_ENV: 'production',
      IDEM_OVERHEAD_SERVER: '1',
      IDEM_OVERHEAD_SPEC: JSON.stringify(spec),
    },
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const next = () =>
    new Promise((resolve, reject) => {
      const onExit = (code) => reject(new Error(`server ${spec.framework}/${spec.variant} exited with ${code}`));
      child.once('exit', onExit);
      child.once('message', (message) => {
        child.off('exit', onExit);
        if (message && typeof message === 'object' && 'error' in message) reject(new Error(String(message.error)));
        else resolve(message);
      });
    });
  return next().then(({ port }) => ({
    port,
    cpu: async () => {
      const answer = next();
      child.send('cpu');
      return answer;
    },
    stop: async () => {
      if (child.exitCode !== null) return;
      child.send('stop');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    },
  }));
}

function positive(text, name) {
  const value = Number(text);
  if (!Number.isFinite(value) || value <= 0) throw new TypeError(`--${name} must be a positive number`);
  return value;
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

function round3(value) {
  return Math.round(value * 1000) / 1000;
}
