// The guard on Fastify, in one run: an unguarded GET route; the same route guarded with one repeated
// token (the verified-token cache answers); and guarded with distinct tokens (every request verifies a
// signature) for HS256, RS256, ES256 and EdDSA. Each verify figure is set against raw `jose.jwtVerify`
// throughput for the same algorithm and key, measured in the same run.
// Run: node --import tsx benchmarks/guard.bench.mjs (or `npm run bench -- guard`).
//
// Servers and the raw jose loop each run in their own child process (this file with `--serve` or
// `--jose`), so the load generator and the measured code get a core each. Peers (@fastify/jwt,
// express-oauth2-jwt-bearer, express-jwt) are not installed in this workspace and are not measured.
import { fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';

const ISSUER = 'https://id.bench';
const AUDIENCE = 'https://api.bench';
const SECRET = 'bench-secret-bench-secret-bench-secret-0123456789';

if (process.argv[2] === '--serve') await serve(process.argv[3]);
else if (process.argv[2] === '--jose') await rawJose();
else await main();

// Children get their key material (and, for jose, the tokens) as the first IPC message.
function setup() {
  return new Promise((resolve) => process.once('message', resolve));
}

// Child: Fastify on an ephemeral port.
async function serve(variant) {
  const { alg, publicJwk } = await setup();
  const Fastify = (await import('fastify')).default;
  const app = Fastify();
  if (variant !== 'bare') {
    const { guard } = await import('@idem/fastify');
    const issuer =
      alg === 'HS256'
        ? { issuer: ISSUER, secret: SECRET }
        : { issuer: ISSUER, publicKeys: [{ ...publicJwk, alg }], algorithms: [alg] };
    // The verify variant cycles through more distinct tokens than the cache holds: every request misses.
    const verify = guard({
      audience: AUDIENCE,
      issuers: [issuer],
      cache: { maxEntries: variant === 'verify' ? 256 : 10_000 },
    });
    app.addHook('onRequest', verify);
  }
  app.get('/orders', async (request) => ({ ok: true, sub: request.auth?.sub ?? null }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  process.send({ port: app.server.address().port });
  process.on('message', async (message) => {
    if (message !== 'stop') return;
    await app.close();
    process.exit(0);
  });
}

// Child: raw jose.jwtVerify over the same tokens, 64 in flight, for BENCH_MS.
async function rawJose() {
  const { importJWK, jwtVerify } = await import('jose');
  const { alg, publicJwk, tokens } = await setup();
  const key = alg === 'HS256' ? new TextEncoder().encode(SECRET) : await importJWK({ ...publicJwk, alg }, alg);
  const durationMs = Number(process.env.BENCH_MS ?? 3000);
  const run = async (ms) => {
    let done = 0;
    let index = 0;
    const until = performance.now() + ms;
    const worker = async () => {
      while (performance.now() < until) {
        await jwtVerify(tokens[index++ % tokens.length], key, {
          issuer: ISSUER,
          audience: AUDIENCE,
          algorithms: [alg],
        });
        done++;
      }
    };
    const started = performance.now();
    await Promise.all(Array.from({ length: 64 }, worker));
    return Math.round(done / ((performance.now() - started) / 1000));
  };
  await run(Math.min(1000, durationMs)); // warm-up
  process.send({ opsPerSecond: await run(durationMs) });
  process.exit(0);
}

function child(args, init) {
  const proc = fork(fileURLToPath(import.meta.url), args, {
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  proc.send(init);
  let stderr = '';
  proc.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  return new Promise((resolve, reject) => {
    proc.once('message', (message) =>
      resolve({
        message,
        stop: () =>
          new Promise((done) => {
            proc.once('exit', done);
            proc.send('stop');
          }),
      }),
    );
    proc.once('exit', (code) =>
      reject(new Error(`child ${args.join(' ')} exited with ${code}: ${stderr.trim().split('\n').at(-1)}`)),
    );
  });
}

async function keyFor(alg) {
  const { exportJWK, generateKeyPair, SignJWT } = await import('jose');
  let signingKey;
  let publicJwk;
  if (alg === 'HS256') {
    signingKey = new TextEncoder().encode(SECRET);
  } else {
    const pair = await generateKeyPair(alg, { extractable: true });
    signingKey = pair.privateKey;
    publicJwk = await exportJWK(pair.publicKey);
  }
  const now = Math.floor(Date.now() / 1000);
  const sign = (jti) =>
    new SignJWT({ scope: 'orders:read', client_id: 'bench' })
      .setProtectedHeader({ alg, typ: 'at+jwt' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setSubject('user-1')
      .setJti(jti)
      .setIssuedAt(now)
      .setExpirationTime(now + 3600)
      .sign(signingKey);
  const tokens = [];
  for (let i = 0; i < 2000; i++) tokens.push(await sign(randomUUID()));
  return { alg, publicJwk, tokens };
}

async function main() {
  const autocannon = (await import('autocannon')).default;
  const durationMs = Number(process.env.BENCH_MS ?? 3_000);
  const quick = process.env.BENCH_QUICK === '1';
  const connections = 50;

  const load = (url, tokens) =>
    new Promise((resolve, reject) => {
      let index = 0;
      autocannon(
        {
          url: `${url}/orders`,
          connections,
          duration: durationMs / 1000,
          requests: [
            {
              // Every variant sends an Authorization header, so the load generator does the same work.
              setupRequest: (request) => ({
                ...request,
                headers: { ...request.headers, authorization: `Bearer ${tokens[index++ % tokens.length]}` },
              }),
            },
          ],
        },
        (error, result) => {
          if (error) reject(error);
          else if (result.non2xx > 0) reject(new Error(`${result.non2xx} non-2xx answers`));
          else resolve(Math.round(result.requests.average));
        },
      );
    });

  const measure = async (variant, key, tokens) => {
    const server = await child(['--serve', variant], { alg: key.alg, publicJwk: key.publicJwk });
    try {
      const url = `http://127.0.0.1:${server.message.port}`;
      await load(url, tokens); // warm-up window, not counted
      return await load(url, tokens);
    } finally {
      await server.stop();
    }
  };

  const results = [];
  const hs = await keyFor('HS256');
  const bare = await measure('bare', hs, hs.tokens);
  results.push({ name: 'Fastify GET, unguarded', opsPerSecond: bare });
  const cached = await measure('cache', hs, [hs.tokens[0]]);
  results.push({ name: 'guarded, one repeated token (cache path)', opsPerSecond: cached, ratio: cached / bare });
  for (const alg of quick ? ['HS256', 'ES256'] : ['HS256', 'RS256', 'ES256', 'EdDSA']) {
    const key = alg === 'HS256' ? hs : await keyFor(alg);
    const verified = await measure('verify', key, key.tokens);
    const jose = await child(['--jose'], key);
    const raw = jose.message.opsPerSecond;
    results.push({ name: `raw jose.jwtVerify ${alg} (in process)`, opsPerSecond: raw });
    results.push({
      name: `guarded, distinct tokens ${alg} (verify path)`,
      opsPerSecond: verified,
      ratio: verified / raw,
    });
  }
  for (const row of results) {
    const ratio = row.ratio === undefined ? '' : `  ratio ${row.ratio.toFixed(2)}`;
    console.log(`${row.name.padEnd(48)} ${String(row.opsPerSecond).padStart(8)}/s${ratio}`);
  }
  const note =
    `Requests per second (autocannon, ${connections} connections, Fastify GET) against raw jose.jwtVerify calls per second ` +
    '(64 in flight, no HTTP), each in its own process, in one run. The cache-path ratio is against the unguarded route ' +
    '(target >= 0.90). Verify-path ratios are against raw jose for the same algorithm and key (target >= 0.80). ' +
    'The verify path cycles through 2,000 distinct tokens with a 256-entry cache, so every request verifies a signature. ' +
    'Peers (@fastify/jwt, express-oauth2-jwt-bearer, express-jwt) are not installed here and are not measured.';
  console.log(JSON.stringify({ benchmark: 'Guard: unguarded vs cache path vs verify path (Fastify)', results, note }));
}
