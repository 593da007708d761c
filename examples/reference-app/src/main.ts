import { Redis } from 'ioredis';
import { startResourceStack } from './api/resource-stack.js';
import { openDatabase } from './db.js';
import { demoUsers } from './seed.js';
import { closeInOrder } from './shutdown.js';
import { startReferenceApp } from './start.js';

/**
 * `npm start`: opens the database (PGlite in `data/`, or PostgreSQL with DATABASE_URL) and, with
 * REDIS_URL, a Redis client for the idempotency keys of the non-transactional routes; starts the
 * identity provider, the third-party app, the gateway, the API and the webhook receiver, prints their
 * URLs and the demo logins, and shuts down cleanly on Ctrl-C (SIGINT), SIGTERM or SIGHUP: requests already
 * running finish, then the stores close; the exit status is 1 when something failed to close.
 */
async function main(): Promise<void> {
  const authPort = Number(process.env.AUTH_PORT ?? 8081);
  const appPort = Number(process.env.APP_PORT ?? 8083);
  const gatewayPort = Number(process.env.GATEWAY_PORT ?? 8080);
  // The gateway's public URL is the access tokens' audience; it follows GATEWAY_PORT unless BASE_URL says otherwise.
  const baseUrl = process.env.BASE_URL ?? `http://localhost:${gatewayPort}`;
  const db = await openDatabase({
    url: process.env.DATABASE_URL,
    ...(process.env.DATA_DIR ? { dataDir: process.env.DATA_DIR } : {}),
  });
  const redis = process.env.REDIS_URL ? await connectRedis(process.env.REDIS_URL) : undefined;
  const storageSteps = [
    // quit, not disconnect: commands already sent (a key being stored) get their replies first.
    { name: 'Redis', close: async () => void (await redis?.quit()) },
    { name: 'the database', close: () => db.close() },
  ];
  const closeStorage = () => closeInOrder(storageSteps);
  let running: Awaited<ReturnType<typeof startReferenceApp>>;
  try {
    running = await startReferenceApp({
      db,
      authPort,
      appPort,
      baseUrl,
      ...(process.env.AUTH_URL ? { authUrl: process.env.AUTH_URL } : {}),
      ...(process.env.APP_URL ? { appUrl: process.env.APP_URL } : {}),
    });
  } catch (error) {
    await closeStorage();
    throw error;
  }
  let resources: Awaited<ReturnType<typeof startResourceStack>>;
  try {
    resources = await startResourceStack({
      db,
      gatewayPort,
      apiPort: Number(process.env.API_PORT ?? 8082),
      receiverPort: Number(process.env.RECEIVER_PORT ?? 8084),
      baseUrl,
      authUrl: running.authUrl,
      ...(redis ? { redis: { client: redis } } : {}),
    });
  } catch (error) {
    await running.close();
    await closeStorage();
    throw error;
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
  let stopping = false;
  const stop = async (signal: string) => {
    // A terminal's Ctrl-C reaches this process and the `npm start` wrapper, which passes it on too.
    if (stopping) return;
    stopping = true;
    console.log(`\n${signal}: stopping (requests already running finish first)...`);
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

/** Connects to Redis before anything starts, so a wrong REDIS_URL fails the start instead of the first request. */
async function connectRedis(url: string): Promise<Redis> {
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 2 });
  // Without a listener a dropped connection would crash the process; ioredis reconnects by itself.
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
