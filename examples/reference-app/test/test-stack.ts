// The resource stack (gateway, API, receiver) behind a test issuer whose tokens the gateway trusts, on
// the file's own test database and Redis prefix. Shared by the HTTP-level test files.
import { randomUUID } from 'node:crypto';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { type ResourceStackOptions, type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { createIdp, type IdpOptions } from '../src/idp/server.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { type RunningReferenceApp, type StartOptions, startReferenceApp } from '../src/start.js';
import { closeTestRedis, openTestDatabase, openTestRedis } from './services.js';

/** What a test mints into an access token. */
export interface TestTokenClaims {
  sub?: string;
  scope?: string;
  roles?: string[];
  /** The OAuth client the token was issued to (`client_id`); default `photo-app`. */
  clientId?: string;
}

/** A running stack, its database, and a way to mint access tokens the gateway accepts. */
export interface TestStack {
  readonly stack: RunningResourceStack;
  readonly db: Database;
  /** The file's Redis client and key prefix when REDIS_URL is set (none when `options.redis` replaced it). */
  readonly redis: Awaited<ReturnType<typeof openTestRedis>>;
  readonly issuer: string;
  readonly audience: string;
  token(claims?: TestTokenClaims): Promise<string>;
  close(): Promise<void>;
}

/** Every scope the API knows, the default of {@link TestStack.token}. */
export const allScopes =
  'photos:read photos:write stock:read stock:write charges:write settings:read settings:write events:read events:write';

/**
 * What a test file may set of the stack: `redis` in place of the file's own Redis (a client that is
 * down, say), no seed rows, its own idempotency event listeners.
 */
export type TestStackOptions = Pick<
  ResourceStackOptions,
  'redis' | 'seed' | 'onApiIdempotencyEvent' | 'onReceiverIdempotencyEvent'
> & {
  /** An in-memory PGlite whatever DATABASE_URL says. */
  embedded?: boolean;
  /**
   * The handle the API and the receiver run on (a statement made to fail, say); the stack's `db`
   * stays the file's own. Their idempotency stores and the outbox take the driver (`client`) itself.
   */
  wrapDb?: (db: Database) => Database;
};

/**
 * Starts the stack for the test file `name`: an ES256 test issuer, tokens with `typ: at+jwt` for the
 * gateway's audience, no background outbox relay (tests drive `relayOnce()`).
 *
 * @example
 * ```ts
 * const test = await startTestStack('api');
 * const token = await test.token({ roles: ['admin'] });
 * ```
 */
export async function startTestStack(name: string, options: TestStackOptions = {}): Promise<TestStack> {
  const issuer = `https://issuer.${name}-test.example`;
  const audience = `http://gateway.${name}-test`;
  const kid = `${name}-test`;
  const pair = await generateKeyPair('ES256');
  const jwk = { ...(await exportJWK(pair.publicKey)), kid, alg: 'ES256' };
  const { embedded, wrapDb, ...stackOptions } = options;
  const db = await openTestDatabase(name, { embedded: embedded ?? false });
  const redis = options.redis === undefined ? await openTestRedis(name) : undefined;
  const stack = await startResourceStack({
    db: wrapDb ? wrapDb(db) : db,
    gatewayPort: 0,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
    relay: false,
    ...(redis ? { redis } : {}),
    ...stackOptions,
  });
  return {
    stack,
    db,
    redis,
    issuer,
    audience,
    token: ({ sub = 'user-alice', scope = allScopes, roles = [], clientId = 'photo-app' } = {}) =>
      new SignJWT({ scope, roles, client_id: clientId })
        .setProtectedHeader({ alg: 'ES256', kid, typ: 'at+jwt' })
        .setIssuer(issuer)
        .setSubject(sub)
        .setAudience(audience)
        .setIssuedAt()
        .setExpirationTime('5m')
        .setJti(randomUUID())
        .sign(pair.privateKey),
    async close() {
      await stack.close();
      await closeTestRedis(redis);
      await db.close();
    },
  };
}

/** The whole reference app of a test file, on its own database and Redis prefix. */
export interface WholeStack {
  readonly db: Database;
  readonly redis: Awaited<ReturnType<typeof openTestRedis>>;
  /** The identity provider and the third-party app. */
  readonly running: RunningReferenceApp;
  /** The gateway, API and receiver, trusting that provider's tokens. */
  readonly stack: RunningResourceStack;
  close(): Promise<void>;
}

/**
 * Starts everything for the test file `name`: the identity provider and the third-party app, then the
 * resource stack behind a gateway whose URL (the access tokens' audience) both needed first. The
 * outbox relay is off unless `options.relay` turns it on.
 *
 * @example
 * ```ts
 * const whole = await startWholeStack('full_stack', { now: () => Date.now() + offsetMs });
 * ```
 */
export async function startWholeStack(
  name: string,
  options: Pick<ResourceStackOptions, 'relay' | 'now'> & Pick<StartOptions, 'loginThrottle'> = {},
): Promise<WholeStack> {
  const db = await openTestDatabase(name);
  const redis = await openTestRedis(name);
  const gatewayPort = await listen(0);
  const running = await startReferenceApp({
    db,
    authPort: 0,
    appPort: 0,
    baseUrl: gatewayPort.url,
    ...(options.loginThrottle ? { loginThrottle: options.loginThrottle } : {}),
  });
  const stack = await startResourceStack({
    db,
    gatewayPort,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: gatewayPort.url,
    authUrl: running.authUrl,
    relay: options.relay ?? false,
    ...(options.now ? { now: options.now } : {}),
    ...(redis ? { redis } : {}),
  });
  return {
    db,
    redis,
    running,
    stack,
    async close() {
      await stack.close();
      await running.close();
      await closeTestRedis(redis);
      await db.close();
    },
  };
}

/**
 * A second identity provider on `whole`'s database, on a port of its own, built as `npm start` builds
 * it behind one proxy (`TRUST_PROXY=1`, read when the provider is built): for tests of what a proxy's
 * forwarded headers may and may not change. `options` go to `createIdp` (a small `loginThrottle`).
 *
 * @example
 * const proxied = await startIdpBehindProxy(whole);
 */
export async function startIdpBehindProxy(
  whole: WholeStack,
  options: Partial<Pick<IdpOptions, 'loginThrottle'>> = {},
): Promise<ListeningPort> {
  const before = process.env.TRUST_PROXY;
  process.env.TRUST_PROXY = '1';
  try {
    const port = await listen(0);
    const idp = await createIdp({
      db: whole.db,
      issuer: port.url,
      resource: whole.stack.gateway.baseUrl,
      ...options,
    });
    port.use(idp.app);
    return port;
  } finally {
    if (before === undefined) delete process.env.TRUST_PROXY;
    else process.env.TRUST_PROXY = before;
  }
}
