// The identity provider and the third-party app twice, as two app processes behind one load balancer:
// each process with its own in-process state and its own database handle on one database (two pools
// on PostgreSQL, the one PGlite for the embedded store, see services.ts), and its own API, which
// answers 200 and records the access token it was sent. Shared by the test files on refreshes and
// session ends across processes; what a file injects (a failing statement, a held token request, a
// refused refresh) stays in that file and comes in through the hooks.
import { createHash } from 'node:crypto';
import type { RequestListener } from 'node:http';
import { expect } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createThirdPartyApp, type ThirdPartyAppOptions } from '../src/app/server.js';
import { createSessionStore, type SessionStore, type SessionTokens } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { createIdp, type IdpOptions } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { seed } from '../src/seed.js';
import { loginAndConsent } from './flow.js';
import { openTestDatabaseTwice, type TwoHandles } from './services.js';
import { alice } from './test-idp.js';
import { createUserAgent, type UserAgent } from './user-agent.js';

/** One of the two app processes. */
export type Process = 0 | 1;

/** The session row's key: the SHA-256 of the session id, as the store keeps it. */
export const hashOf = (id: string) => createHash('sha256').update(id).digest('base64url');

export interface TwoAppStackOptions {
  /** Goes into the PostgreSQL schema's name (see services.ts). */
  name: string;
  /** An in-memory PGlite whatever DATABASE_URL says. */
  embedded?: boolean;
  /** The provider's options beyond its database, issuer and resource. */
  idp?: Omit<IdpOptions, 'db' | 'issuer' | 'resource'>;
  /** The database handle the provider runs on (default: the first process's). */
  wrapIdpDb?: (db: Database) => Database;
  /** What the provider's port serves (default: the provider itself), given the provider. */
  authMiddleware?: (idp: RequestListener) => RequestListener;
  /** The database handle process `i` runs on (default: its own handle, untouched). */
  wrapDb?: (db: Database, i: Process) => Database;
  /** Options of process `i` over the shared ones (a client secret, an `onEvent`, a `baseUrl`). */
  app?: (i: Process, client: { clientId: string; clientSecret: string }) => Partial<ThirdPartyAppOptions>;
  /** The apps' clock (both processes share it); the real one by default. */
  now?: () => number;
  /** Both processes call the first process's API, so `sentTokens[0]` has every call in the order it came. */
  sharedApi?: boolean;
}

export interface TwoAppStack {
  readonly dbs: TwoHandles;
  readonly authUrl: string;
  readonly appUrls: [string, string];
  /** The app's seeded confidential client, as the provider knows it. */
  readonly client: { clientId: string; clientSecret: string };
  /** Access tokens each process sent to its API, by process (all in the first with `sharedApi`). */
  readonly sentTokens: [string[], string[]];
  /** A session store on the first handle, to read and claim rows as either process would. */
  sessions(): SessionStore;
  /** Signs alice in at the first process; the session id, the cookie header, its tokens, the browser. */
  signIn(): Promise<{ id: string; cookie: string; tokens: SessionTokens; agent: UserAgent }>;
  /** GET / at process `i` with the browser's cookie. */
  page(i: Process, cookie: string): Promise<{ status: number; body: string }>;
  /** The claim on the session's refresh: who holds it, and whether its time is still running. */
  claimOf(id: string): Promise<{ by: string | null; running: boolean }>;
  /** How many refresh tokens the grant of `refreshToken` has had: one more per refresh. */
  refreshTokensOfGrant(refreshToken: string): Promise<number>;
  /** Closes every port, then the database (dropping a PostgreSQL schema). */
  close(): Promise<void>;
}

/**
 * Starts the provider and two app processes on one database, both answering as the first: the
 * provider knows one redirect URI, as behind a load balancer.
 *
 * @example
 * ```ts
 * let stack: TwoAppStack;
 * beforeAll(async () => {
 *   stack = await startTwoAppStack({ name: 'refresh_lock', now: () => Date.now() + clock });
 * }, 120_000);
 * afterAll(() => stack?.close());
 * ```
 */
export async function startTwoAppStack(options: TwoAppStackOptions): Promise<TwoAppStack> {
  const dbs = await openTestDatabaseTwice(options.name, { embedded: options.embedded ?? false });
  const ports: ListeningPort[] = [];
  const close = async () => {
    await Promise.allSettled(ports.map((port) => port.close()));
    await dbs.close();
  };
  try {
    const authPort = await listen(0);
    ports.push(authPort);
    const appPorts = [await listen(0), await listen(0)] as const;
    ports.push(...appPorts);
    const apiPorts = [await listen(0), await listen(0)] as const;
    ports.push(...apiPorts);
    const authUrl = authPort.url;
    const appUrls: [string, string] = [appPorts[0].url, appPorts[1].url];
    await migrateApp(dbs.one);
    const clients = await seed(dbs.one, { appRedirectUri: new URL('/callback', appUrls[0]).href });
    const idp = await createIdp({
      ...options.idp,
      db: options.wrapIdpDb ? options.wrapIdpDb(dbs.one) : dbs.one,
      issuer: authUrl,
      resource: 'http://127.0.0.1:1',
    });
    authPort.use(options.authMiddleware ? options.authMiddleware(idp.app) : idp.app);
    const sentTokens: [string[], string[]] = [[], []];
    for (const [i, port] of apiPorts.entries()) {
      port.use((req, res) => {
        sentTokens[i]?.push((req.headers.authorization ?? '').replace(/^Bearer /, ''));
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    }
    for (const i of [0, 1] as const) {
      const { app } = await createThirdPartyApp({
        db: options.wrapDb ? options.wrapDb(dbs[i === 0 ? 'one' : 'two'], i) : dbs[i === 0 ? 'one' : 'two'],
        issuer: authUrl,
        clientId: clients.app.clientId,
        clientSecret: clients.app.clientSecret,
        appUrl: appUrls[0],
        baseUrl: apiPorts[options.sharedApi ? 0 : i].url,
        resource: 'http://127.0.0.1:1',
        now: options.now,
        stockItems: ['item-1'],
        ...options.app?.(i, clients.app),
      });
      appPorts[i].use(app);
    }

    const sessions = () => createSessionStore(dbs.one, { ttlSeconds: 3600 });
    return {
      dbs,
      authUrl,
      appUrls,
      client: clients.app,
      sentTokens,
      sessions,
      async signIn() {
        const agent = createUserAgent();
        const callback = await loginAndConsent(
          agent,
          authUrl,
          new URL('/signin', appUrls[0]).href,
          new URL('/callback', appUrls[0]).href,
          alice,
        );
        await agent.request(callback.href);
        const id = agent.jar.cookies.get('app_session')?.value ?? '';
        const tokens = (await sessions().get(id))?.tokens;
        expect(tokens?.refreshToken).toEqual(expect.any(String));
        return { id, cookie: agent.jar.header(), tokens: tokens!, agent };
      },
      page: (i, cookie) =>
        fetch(new URL('/', appUrls[i]).href, { headers: { cookie }, redirect: 'manual' }).then(async (response) => ({
          status: response.status,
          body: await response.text(),
        })),
      async claimOf(id) {
        const { rows } = await dbs.one.query<{ by: string | null; running: boolean }>(
          `select refreshing_by as by, coalesce(refreshing_until > now(), false) as running
             from app_sessions where id_hash = $1`,
          [hashOf(id)],
        );
        return rows[0]!;
      },
      async refreshTokensOfGrant(refreshToken) {
        const { rows } = await dbs.one.query<{ count: number }>(
          `select count(*)::int as count from idp_models where model = 'RefreshToken' and grant_id =
             (select grant_id from idp_models where model = 'RefreshToken' and id = $1)`,
          [storedId('RefreshToken', refreshToken)],
        );
        return rows[0]?.count ?? 0;
      },
      close,
    };
  } catch (error) {
    // A start that failed half way must not leave ports open or the file's schema behind.
    await close();
    throw error;
  }
}
