import { migrateApp } from './app/schema.js';
import { appSessionLifetimeSeconds, createThirdPartyApp, type ThirdPartyAppOptions } from './app/server.js';
import type { Database } from './db.js';
import { purgeExpiredModels } from './idp/adapter.js';
import { createLoginThrottle } from './idp/login-throttle.js';
import { refreshTokenReuse } from './idp/reuse-interval.js';
import { createIdp, type Idp, type IdpOptions } from './idp/server.js';
import { sessionIdle, sessionLifetime } from './idp/session-lifetime.js';
import { type ListeningPort, listen } from './listen.js';
import { purgeEvery } from './purge-every.js';
import { type SeededClients, seed } from './seed.js';

/** Ports and URLs for {@link startReferenceApp}; 0 picks an ephemeral port. */
export interface StartOptions {
  db: Database;
  /** The identity provider's port (env AUTH_PORT, default 8081). */
  authPort: number;
  /** The third-party app's port (env APP_PORT, default 8083). */
  appPort: number;
  /** The gateway's base URL, which is also the API's resource indicator (env BASE_URL). */
  baseUrl: string;
  /** Public URLs when they differ from `http://localhost:<port>` (a proxy in front). */
  authUrl?: string | undefined;
  appUrl?: string | undefined;
  /** The third-party app's clock, epoch milliseconds. */
  now?: (() => number) | undefined;
  /** The third-party app's retry timers for "Create charge" (tests). */
  retryTiming?: ThirdPartyAppOptions['retryTiming'] | undefined;
  /** The third-party app's clock and pause for its refresh waits (tests; see `createThirdPartyApp`). */
  refreshTiming?: ThirdPartyAppOptions['refreshTiming'] | undefined;
  /** What the third-party app reports (default: a line on stderr). */
  onAppEvent?: ThirdPartyAppOptions['onEvent'] | undefined;
  /**
   * How often the provider's expired rows are deleted, in milliseconds: a whole number from 1 to
   * 2147483647 (a Node timer's longest), else a `TypeError` before any port is bound. Default ten minutes.
   */
  purgeEveryMs?: number | undefined;
  /** The login page's limit on wrong passwords (see `createIdp`). */
  loginThrottle?: IdpOptions['loginThrottle'] | undefined;
  /** The provider's refresh token reuse interval (env REFRESH_TOKEN_REUSE_SECONDS; see `createIdp`). */
  refreshTokenReuseSeconds?: number | undefined;
  /** The provider's sign-in session lifetime (env SESSION_LIFETIME_SECONDS; see `createIdp`). */
  sessionLifetimeSeconds?: number | undefined;
  /**
   * How long a sign-in lasts without use, at the provider and at the third-party app alike (env
   * SESSION_IDLE_SECONDS): 30 minutes by default; from 60 to the provider's session lifetime.
   */
  sessionIdleSeconds?: number | undefined;
}

/** The running components. */
export interface RunningReferenceApp {
  readonly authUrl: string;
  readonly appUrl: string;
  readonly clients: SeededClients;
  readonly idp: Idp;
  /**
   * Closes the third-party app alone (its requests still running finish first), then writes the line
   * its default report of refused refreshes counted since its last one. A shutdown closes it
   * before the gateway and the API it calls, and the provider last: the gateway checks tokens with the
   * provider's keys while it drains.
   */
  closeApp(): Promise<void>;
  /** Closes both, the app first. */
  close(): Promise<void>;
}

/**
 * Starts what exists of the reference app on one database: the identity provider and the third-party
 * app. Ports are bound first, because each component needs the other's URL (the app's redirect URI is
 * registered at the provider; the provider's issuer is where the app discovers it).
 *
 * @example
 * ```ts
 * const running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: 'http://localhost:8080' });
 * console.log(running.authUrl, running.appUrl);
 * await running.close();
 * ```
 */
export async function startReferenceApp(options: StartOptions): Promise<RunningReferenceApp> {
  // Every option is checked before a port is bound or the database is touched, as `npm start` checks
  // its environment first: a bad value is one TypeError, not a start half made and closed again.
  const purgeEveryMs = purgeEvery(options.purgeEveryMs, 'purgeEveryMs');
  refreshTokenReuse(options.refreshTokenReuseSeconds);
  sessionIdle(options.sessionIdleSeconds, sessionLifetime(options.sessionLifetimeSeconds));
  createLoginThrottle(options.loginThrottle);
  const ports: ListeningPort[] = [];
  try {
    const authPort = await listen(options.authPort, options.authUrl ? { publicUrl: options.authUrl } : {});
    ports.push(authPort);
    const appPort = await listen(options.appPort, options.appUrl ? { publicUrl: options.appUrl } : {});
    ports.push(appPort);

    // seed() makes the provider's tables (migrateIdp) before it writes to them.
    await migrateApp(options.db);
    const clients = await seed(options.db, { appRedirectUri: new URL('/callback', appPort.url).href });

    const idp = await createIdp({
      db: options.db,
      issuer: authPort.url,
      resource: options.baseUrl,
      ...(options.loginThrottle ? { loginThrottle: options.loginThrottle } : {}),
      refreshTokenReuseSeconds: options.refreshTokenReuseSeconds,
      sessionLifetimeSeconds: options.sessionLifetimeSeconds,
      sessionIdleSeconds: options.sessionIdleSeconds,
      // The app's session ends 12 hours after the password: its refresh tokens with it.
      refreshTokensEndAfterPassword: { [clients.app.clientId]: appSessionLifetimeSeconds },
    });
    authPort.use(idp.app);
    const { app, flushLog } = await createThirdPartyApp({
      db: options.db,
      issuer: authPort.url,
      clientId: clients.app.clientId,
      clientSecret: clients.app.clientSecret,
      appUrl: appPort.url,
      baseUrl: options.baseUrl,
      ...(options.now ? { now: options.now } : {}),
      ...(options.retryTiming ? { retryTiming: options.retryTiming } : {}),
      ...(options.refreshTiming ? { refreshTiming: options.refreshTiming } : {}),
      ...(options.onAppEvent ? { onEvent: options.onAppEvent } : {}),
      sessionIdleSeconds: options.sessionIdleSeconds,
    });
    appPort.use(app);

    // oidc-provider never deletes what expired (sessions, interactions, codes, tokens): without this
    // its table would grow for as long as the app runs. A failed pass is said on stderr (a database
    // that keeps refusing it is worth knowing about) and tried again at the next tick.
    const purge = setInterval(() => {
      purgeExpiredModels(options.db).catch((error: unknown) => {
        const reason = error instanceof Error ? error.message : String(error);
        process.stderr.write(`identity provider: deleting expired rows failed: ${reason}\n`);
      });
    }, purgeEveryMs);
    purge.unref();

    return {
      authUrl: authPort.url,
      appUrl: appPort.url,
      clients,
      idp,
      // The app's counted log last, once its requests are done: the refusals they met are told too.
      // A second flush writes nothing (the first emptied it): closeApp() may have run before close().
      async closeApp() {
        await appPort.close();
        flushLog();
      },
      async close() {
        clearInterval(purge);
        // A second close of the app's port is the first one's (see drainable): closeApp() may have run.
        await appPort.close();
        flushLog();
        await authPort.close();
      },
    };
  } catch (error) {
    await Promise.allSettled(ports.map((port) => port.close()));
    throw error;
  }
}
