// Per framework, in one run: the bare POST /charges route, and the same route behind idem on
// memoryStore, Redis and PostgreSQL, for fresh keys (every request executes) and for replays (one
// key, every request after the first is served from the store). Ratios are against the bare route
// of the same framework, measured in the same run, interleaved round after round.
// Run: node --import tsx benchmarks/adapters.bench.mjs (or `npm run bench -- adapters`).
//
// Each server runs in its own child process (this file with `--serve`), so the load generator
// (autocannon, in this process) and the server each get one of the two cores instead of fighting
// over one event loop. Redis and PostgreSQL are the shared ones (REDIS_URL, DATABASE_URL); when one
// is unreachable, its rows say so instead of a figure.
import { fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

if (process.argv[2] === '--serve') {
  await serve(process.argv[3], process.argv[4]);
} else {
  await main();
}

async function makeStore(kind) {
  const { memoryStore } = await import('@idem/core');
  if (kind === 'memory') return { store: memoryStore({ maxEntries: 2_000_000 }), close: async () => {} };
  if (kind === 'redis') {
    const { Redis } = await import('ioredis');
    const { redisStore } = await import('@idem/redis');
    const client = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
    client.on('error', () => {});
    await client.ping();
    const prefix = `idem-bench:adapters:${randomUUID()}:`;
    return {
      store: redisStore({ client, prefix }),
      close: async () => {
        let cursor = '0';
        do {
          const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 5000);
          cursor = next;
          if (keys.length > 0) await client.unlink(...keys);
        } while (cursor !== '0');
        client.disconnect();
      },
    };
  }
  const pg = (await import('pg')).default;
  const { migrate, postgresStore } = await import('@idem/postgres');
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 32 });
  pool.on('error', () => {});
  const table = `idem_bench_adapters_${randomUUID().slice(0, 8)}`;
  await migrate(pool, { table });
  return {
    store: postgresStore({ client: pool, table }),
    close: async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    },
  };
}

// Child: one server on an ephemeral port; prints the port, stops on 'stop'.
async function serve(framework, variant) {
  const store = variant === 'bare' ? undefined : await makeStore(variant);
  const options = store && { store: store.store, scope: () => 'bench', heartbeat: false };
  let count = 0;
  const charge = (amount) => ({ id: `ch_${++count}`, amount });
  let close;
  let port;
  if (framework === 'express') {
    const express = (await import('express')).default;
    const { idempotency } = await import('@idem/express');
    const app = express();
    const handlers = [express.json(), (req, res) => res.status(201).json(charge(req.body.amount))];
    if (options) app.post('/charges', idempotency(options), ...handlers);
    else app.post('/charges', ...handlers);
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    port = server.address().port;
    close = () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      });
  } else if (framework === 'fastify') {
    const Fastify = (await import('fastify')).default;
    const { idempotency } = await import('@idem/fastify');
    const app = Fastify();
    if (options) await app.register(idempotency, options);
    app.post('/charges', async (request, reply) => reply.code(201).send(charge(request.body.amount)));
    await app.listen({ port: 0, host: '127.0.0.1' });
    port = app.server.address().port;
    close = () => app.close();
  } else {
    const Koa = (await import('koa')).default;
    const { json } = await import('node:stream/consumers');
    const { idempotency } = await import('@idem/koa');
    const app = new Koa();
    if (options) app.use(idempotency(options));
    app.use(async (ctx) => {
      const body = await json(ctx.req);
      ctx.status = 201;
      ctx.body = charge(body.amount);
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    port = server.address().port;
    close = () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      });
  }
  process.send({ port });
  process.on('message', async (message) => {
    if (message !== 'stop') return;
    await close();
    await store?.close();
    process.exit(0);
  });
}

function startServer(framework, variant) {
  const child = fork(fileURLToPath(import.meta.url), ['--serve', framework, variant], {
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  let stderr = '';
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  return new Promise((resolve, reject) => {
    child.once('message', ({ port }) =>
      resolve({
        url: `http://127.0.0.1:${port}`,
        stop: () =>
          new Promise((done) => {
            child.once('exit', done);
            child.send('stop');
          }),
      }),
    );
    child.once('exit', (code) =>
      reject(new Error(`server ${framework}/${variant} exited with ${code}: ${stderr.trim().split('\n').at(-1)}`)),
    );
  });
}

async function main() {
  const autocannon = (await import('autocannon')).default;
  const durationMs = Number(process.env.BENCH_MS ?? 3_000);
  const quick = process.env.BENCH_QUICK === '1';
  const rounds = quick ? 1 : 3;
  const connections = 50;
  const body = '{"amount":100}';

  const load = async (url, mode) => {
    const replayKey = `replay-${randomUUID()}`;
    if (mode === 'replay') {
      // The first request with the key executes; everything the load sends after it is a replay.
      const first = await fetch(`${url}/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': replayKey },
        body,
      });
      await first.arrayBuffer();
    }
    return new Promise((resolve, reject) => {
      autocannon(
        {
          url: `${url}/charges`,
          method: 'POST',
          connections,
          duration: durationMs / 1000,
          headers: { 'content-type': 'application/json' },
          body,
          requests: [
            {
              // Every mode builds each request with one random header, so the load generator does the
              // same work whatever it measures; only the server side differs.
              setupRequest: (request) => {
                const nonce = randomUUID();
                const extra =
                  mode === 'bare' ? { 'x-nonce': nonce } : { 'idempotency-key': mode === 'fresh' ? nonce : replayKey };
                return { ...request, headers: { ...request.headers, ...extra } };
              },
            },
          ],
        },
        (error, result) => {
          if (error) reject(error);
          else if (result.non2xx > 0) reject(new Error(`${result.non2xx} non-2xx answers (${mode})`));
          else resolve(Math.round(result.requests.average));
        },
      );
    });
  };

  const measure = async (framework, variant, mode) => {
    const server = await startServer(framework, variant);
    try {
      await load(server.url, mode); // warm-up window, not counted
      return await load(server.url, mode);
    } finally {
      await server.stop();
    }
  };

  const variants = [
    ['bare', 'bare', 'bare route'],
    ['memory', 'fresh', 'idem on memoryStore, fresh keys'],
    ['memory', 'replay', 'idem on memoryStore, replays'],
    ['redis', 'fresh', 'idem on Redis, fresh keys'],
    ['redis', 'replay', 'idem on Redis, replays'],
    ['postgres', 'fresh', 'idem on PostgreSQL, fresh keys'],
    ['postgres', 'replay', 'idem on PostgreSQL, replays'],
  ];
  const frameworks = ['express', 'fastify', 'koa'];
  const samples = new Map();
  const failures = new Map();
  for (let round = 0; round < rounds; round++) {
    for (const framework of frameworks) {
      for (const [variant, mode, label] of variants) {
        const name = `${framework}: ${label}`;
        if (failures.has(name)) continue;
        try {
          const value = await measure(framework, variant, mode);
          samples.set(name, [...(samples.get(name) ?? []), value]);
        } catch (error) {
          failures.set(name, error instanceof Error ? error.message : String(error));
        }
      }
    }
  }
  const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const results = [];
  for (const framework of frameworks) {
    const bare = samples.get(`${framework}: bare route`);
    const bareRate = bare ? median(bare) : undefined;
    for (const [, , label] of variants) {
      const name = `${framework}: ${label}`;
      const values = samples.get(name);
      if (!values) {
        results.push({ name: `${name} (not measured: ${failures.get(name) ?? 'no sample'})` });
        continue;
      }
      const opsPerSecond = median(values);
      const row = { name, opsPerSecond };
      if (label !== 'bare route' && bareRate) row.ratio = opsPerSecond / bareRate;
      results.push(row);
    }
  }
  for (const row of results) {
    const ratio = row.ratio === undefined ? '' : `  ratio ${row.ratio.toFixed(2)}`;
    console.log(`${row.name.padEnd(48)} ${String(row.opsPerSecond ?? '-').padStart(8)}/s${ratio}`);
  }
  const note =
    `Requests per second (autocannon, ${connections} connections, POST with a JSON body), medians of ${rounds} interleaved round(s); ` +
    'each server in its own process. Ratios are against the bare route of the same framework in the same run. ' +
    'Targets with memoryStore: fresh keys >= 0.85, replays >= 1.00. Fresh keys execute every request; replays use one key, so every request after the first is answered from the store without running the handler.';
  console.log(
    JSON.stringify({ benchmark: 'Adapters: bare route vs idem per store (Express, Fastify, Koa)', results, note }),
  );
}
