import { constants } from 'node:os';
import { Redis } from 'ioredis';
import { startResourceStack } from './api/resource-stack.js';
import { ConfigError, envPort, envSeconds, envUrl } from './env.js';
import { maxRefreshTokenReuseSeconds } from './idp/reuse-interval.js';
import { maxSessionLifetimeSeconds, sessionIdleBounds } from './idp/session-lifetime.js';
import { openDatabaseFromEnv } from './open-from-env.js';
import { closeInOrder } from './shutdown.js';
import type { startReferenceApp } from './start.js';

/**
 * `npm start`: opens the database (PGlite in `data/`, or PostgreSQL with DATABASE_URL) and, with
 * REDIS_URL, a Redis client for the idempotency keys of the non-transactional routes; starts the
 * identity provider, the third-party app, the gateway, the API and the webhook receiver, prints their
 * URLs and the demo logins, and shuts down cleanly on Ctrl-C (SIGINT), SIGTERM or SIGHUP: requests already
 * running finish, then the stores close; the exit status is 1 when something failed to close.
 */
async function main(): Promise<void> {
  const env = process.env;
  // One record: the ports, and the variable each came from for the messages that name it.
  const ports = {
    AUTH_PORT: envPort(env, 'AUTH_PORT', 8081),
    APP_PORT: envPort(env, 'APP_PORT', 8083),
    GATEWAY_PORT: envPort(env, 'GATEWAY_PORT', 8080),
    API_PORT: envPort(env, 'API_PORT', 8082),
    RECEIVER_PORT: envPort(env, 'RECEIVER_PORT', 8084),
  };
  // The gateway's public URL is the access tokens' audience; it follows GATEWAY_PORT unless BASE_URL says otherwise.
  const baseUrl = envUrl(env, 'BASE_URL') ?? `http://localhost:${ports.GATEWAY_PORT}`;
  const authUrl = envUrl(env, 'AUTH_URL');
  const appUrl = envUrl(env, 'APP_URL');
  const redisUrl = env.REDIS_URL === '' ? undefined : env.REDIS_URL;
  // The identity provider's refresh token reuse interval (`createIdp`); unset, its default (30).
  const refreshTokenReuseSeconds = envSeconds(env, 'REFRESH_TOKEN_REUSE_SECONDS', maxRefreshTokenReuseSeconds);
  // How long a killed execution's idempotency key stays locked (`startResourceStack`'s
  // idempotencyLease); unset, the core's default (10 s). At least a second: the lease is renewed every
  // third of it, and a shorter one is lost to a busy event loop. At most the core's own limit (7 days).
  const idempotencyLeaseSeconds = envSeconds(env, 'IDEMPOTENCY_LEASE_SECONDS', 7 * 24 * 3600, 1);
  // How long its sign-in session lasts after the password (`createIdp`); unset, its default (12 hours).
  const sessionLifetimeSeconds = envSeconds(env, 'SESSION_LIFETIME_SECONDS', maxSessionLifetimeSeconds, 1);
  // How long a sign-in lasts without use, at the provider and the app (`startReferenceApp`); unset, its
  // default (30 minutes). At least a minute (the app records use once a minute), at most the lifetime.
  const idleBounds = sessionIdleBounds(sessionLifetimeSeconds);
  const sessionIdleSeconds = envSeconds(env, 'SESSION_IDLE_SECONDS', idleBounds.max, idleBounds.min);
  const names = Object.keys(ports) as (keyof typeof ports)[];
  for (const [index, name] of names.entries()) {
    const other = names.slice(index + 1).find((candidate) => ports[candidate] === ports[name]);
    if (other !== undefined) {
      throw new ConfigError(`${name} and ${other} are both ${ports[name]}; give each its own port`);
    }
  }
  // Read as a flag by the provider and the app; `true` or `yes` would silently mean "no proxy".
  if (env.TRUST_PROXY !== undefined && !['', '0', '1'].includes(env.TRUST_PROXY)) {
    throw new ConfigError(`TRUST_PROXY must be 1 (behind a proxy) or 0, not ${JSON.stringify(env.TRUST_PROXY)}`);
  }
  // Redis first: it answers or refuses at once, while a first PGlite open takes seconds, and a wrong
  // REDIS_URL should not wait for that to be reported.
  const redis = redisUrl === undefined ? undefined : await connectRedis(redisUrl);
  let db: Awaited<ReturnType<typeof openDatabaseFromEnv>>;
  try {
    db = await openDatabaseFromEnv(env);
  } catch (error) {
    redis?.disconnect();
    throw error;
  }
  const storageSteps = [
    // quit, not disconnect: commands already sent (a key being stored) get their replies first.
    { name: 'Redis', close: async () => void (await redis?.quit()) },
    { name: 'the database', close: () => db.close() },
  ];
  const closeStorage = () => closeInOrder(storageSteps);
  // Loaded only now, once the configuration passed: oidc-provider prints a warning of its own when it
  // loads on a Node release that is not LTS, which would otherwise come before a configuration error
  // and make it two lines.
  const [{ startReferenceApp: start }, { demoUsers }] = await Promise.all([import('./start.js'), import('./seed.js')]);
  let running: Awaited<ReturnType<typeof startReferenceApp>>;
  try {
    running = await start({
      db,
      authPort: ports.AUTH_PORT,
      appPort: ports.APP_PORT,
      baseUrl,
      ...(authUrl ? { authUrl } : {}),
      ...(appUrl ? { appUrl } : {}),
      refreshTokenReuseSeconds,
      sessionLifetimeSeconds,
      sessionIdleSeconds,
    });
  } catch (error) {
    await closeStorage();
    throw portRefusal(error, ports);
  }
  let resources: Awaited<ReturnType<typeof startResourceStack>>;
  try {
    resources = await startResourceStack({
      db,
      gatewayPort: ports.GATEWAY_PORT,
      apiPort: ports.API_PORT,
      receiverPort: ports.RECEIVER_PORT,
      baseUrl,
      authUrl: running.authUrl,
      ...(redis ? { redis: { client: redis } } : {}),
      ...(idempotencyLeaseSeconds === undefined ? {} : { idempotencyLease: idempotencyLeaseSeconds * 1000 }),
    });
  } catch (error) {
    await running.close();
    await closeStorage();
    throw portRefusal(error, ports);
  }

  console.log(
    `idem reference app (database: ${db.kind === 'pglite' ? 'embedded PGlite' : 'PostgreSQL'}; ` +
      `keys of non-transactional routes: ${redis ? 'Redis' : 'the database'})`,
  );
  console.log(`  identity provider  ${running.authUrl}`);
  console.log(`  third-party app    ${running.appUrl}   <- open this`);
  console.log(`  gateway (API)      ${resources.gateway.baseUrl}`);
  console.log(`  API (loopback)     ${resources.api.url}`);
  console.log(`  webhook receiver   ${resources.receiver.pageUrl}`);
  console.log('Demo logins (development only):');
  for (const user of demoUsers) {
    console.log(`  ${user.username} / ${user.password}${user.roles.length ? `   (${user.roles.join(', ')})` : ''}`);
  }
  let stoppingSince: number | undefined;
  const stop = async (signal: NodeJS.Signals) => {
    if (stoppingSince !== undefined) {
      // A terminal's Ctrl-C reaches this process and the `npm start` wrapper, which passes it on
      // too: that copy comes within milliseconds. A signal a second or more later is someone asking
      // again because the stop takes too long (a request that will not end, a stuck store): leave now.
      if (performance.now() - stoppingSince < 1000) return;
      console.error(`${signal} again: exiting now, without waiting for what is still running.`);
      process.exit(128 + (constants.signals[signal] ?? 0));
    }
    stoppingSince = performance.now();
    console.log(`\n${signal}: stopping (requests already running finish first; signal again to exit at once)...`);
    try {
      // From the front: the app (it calls the gateway), then the gateway, the API and the receiver
      // (the gateway checks tokens with the provider's keys while it drains), then the provider.
      await closeInOrder([
        { name: 'the third-party app', close: () => running.closeApp() },
        { name: 'the gateway, the API and the receiver', close: () => resources.close() },
        { name: 'the identity provider', close: () => running.close() },
        ...storageSteps,
      ]);
      process.exit(0);
    } catch (error) {
      console.error(error);
      process.exit(1);
    }
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => void stop(signal));
  // Said once the handlers are in place: a supervisor that signals as soon as it reads this line
  // must not find the process without them (the default action would kill it, nothing closed).
  console.log('Ctrl-C stops everything.');
}

// A port another process holds, or one this user may not bind (below 1024): one line naming the
// variable that chose it, instead of listen()'s stack.
function portRefusal(error: unknown, ports: Readonly<Record<string, number>>): unknown {
  const { code, port } = error as { code?: unknown; port?: unknown };
  if (code !== 'EADDRINUSE' && code !== 'EACCES') return error;
  const name = Object.keys(ports).find((candidate) => ports[candidate] === port);
  if (name === undefined) return error;
  const why = code === 'EADDRINUSE' ? 'is already in use (another npm start?)' : 'may not be opened by this user';
  return new ConfigError(`${name}: port ${port} ${why}`);
}

/** Connects to Redis before anything starts, so a wrong REDIS_URL fails the start instead of the first request. */
async function connectRedis(url: string): Promise<Redis> {
  // ioredis reads `http://x` as host `http` and path `//x`, and the failure then names neither.
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(url)?.[1]?.toLowerCase();
  if (scheme !== undefined && scheme !== 'redis' && scheme !== 'rediss') {
    throw new ConfigError(`REDIS_URL must be a redis:// or rediss:// URL, not ${scheme}://...`);
  }
  let client: Redis;
  try {
    client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 2 });
  } catch (error) {
    throw new ConfigError(`REDIS_URL is not a Redis URL: ${(error as Error).message}`);
  }
  // Without a listener a dropped connection would crash the process; ioredis reconnects by itself.
  let lastError: Error | undefined;
  client.on('error', (error: Error) => {
    lastError = error;
  });
  try {
    await client.connect();
  } catch (error) {
    client.disconnect();
    const cause = lastError ?? (error as Error);
    const { host, port, db } = client.options;
    // Where it tried, as ioredis read the URL: never a user, a password (the query may carry one too).
    throw new ConfigError(`REDIS_URL: cannot connect to ${host}:${port} (db ${db ?? 0}): ${cause.message}`);
  }
  return client;
}

main().catch((error: unknown) => {
  // A configuration mistake is one line naming the variable; anything else keeps its stack.
  console.error(error instanceof ConfigError ? error.message : error);
  process.exit(1);
});
