import net from 'node:net';

/** The Redis the integration tests share: `REDIS_URL`, by default the local server. */
export const redisUrl = (): string => process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** The PostgreSQL the integration tests share: `DATABASE_URL`, by default the local `test` database. */
export const databaseUrl = (): string => process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

// Sends `request` to host:port and resolves with whether the first bytes of the answer satisfy `ok`.
function probe(url: URL, fallbackPort: number, request: Buffer, ok: (answer: Buffer) => boolean, timeoutMs: number) {
  return new Promise<boolean>((resolve) => {
    const socket = net.connect({ host: url.hostname || '127.0.0.1', port: Number(url.port || fallbackPort) });
    let answer = Buffer.alloc(0);
    let settled = false;
    const done = (result: boolean) => {
      if (settled) return;
      settled = true;
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('error', () => done(false));
    // A peer that hangs up without answering (another protocol's server) is not the service.
    socket.once('close', () => done(false));
    socket.once('connect', () => socket.write(request));
    socket.on('data', (chunk: Buffer) => {
      answer = Buffer.concat([answer, chunk]);
      if (answer.length >= 1) done(ok(answer));
    });
  });
}

const resp = (...args: string[]) =>
  Buffer.from(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);

/**
 * True when a Redis server answers `PING` at `url`. It speaks RESP over a plain socket, so the testkit
 * needs no Redis client; a URL with a password sends `AUTH` first.
 *
 * @example
 * if (await redisAnswers()) runRedisTests();
 */
export function redisAnswers(url = redisUrl(), timeoutMs = 1_500): Promise<boolean> {
  const parsed = new URL(url);
  const auth = parsed.password
    ? resp(
        'AUTH',
        ...(parsed.username ? [decodeURIComponent(parsed.username)] : []),
        decodeURIComponent(parsed.password),
      )
    : Buffer.alloc(0);
  // With AUTH the first answer is AUTH's: +OK then +PONG; without, just +PONG.
  const expected = parsed.password ? '+OK' : '+PONG';
  return probe(
    parsed,
    6379,
    Buffer.concat([auth, resp('PING')]),
    (a) => a.toString('latin1').startsWith(expected),
    timeoutMs,
  );
}

/**
 * True when a PostgreSQL server answers at `url`: it sends the protocol's `SSLRequest`, to which a
 * PostgreSQL server replies with one byte, `S` or `N`, before any authentication.
 *
 * @example
 * if (await postgresAnswers()) runPostgresTests();
 */
export function postgresAnswers(url = databaseUrl(), timeoutMs = 1_500): Promise<boolean> {
  const sslRequest = Buffer.alloc(8);
  sslRequest.writeInt32BE(8, 0);
  sslRequest.writeInt32BE(80_877_103, 4);
  return probe(new URL(url), 5432, sslRequest, (a) => a[0] === 0x53 || a[0] === 0x4e, timeoutMs);
}

/**
 * Decides what a test file does about a service it needs: `true` when it is there; when it is not,
 * says so loudly and returns `false` so the file can skip, except with `CI=true`, where it throws:
 * CI must never pass by skipping.
 *
 * @example
 * const withRedis = serviceAvailable(`Redis at ${redisUrl()}`, await redisAnswers(), 'the Redis receiver tests');
 * describe.runIf(withRedis)('receiver on Redis', () => {
 *   // …
 * });
 */
export function serviceAvailable(what: string, available: boolean, skipped: string): boolean {
  if (available) return true;
  const message = `${what} is not reachable: ${skipped} are SKIPPED.`;
  if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
  console.warn(`\n!!! ${message}\n`);
  return false;
}
