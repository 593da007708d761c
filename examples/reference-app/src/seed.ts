import { randomBytes } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import type { ClientMetadata } from 'oidc-provider';
import type { Database } from './db.js';
import { ConfigError, envPort, envUrl } from './env.js';
import { addClientIfMissing, findClient, saveClient } from './idp/clients.js';
import { migrateIdp } from './idp/schema.js';
import { createUser } from './idp/users.js';
import { openDatabaseFromEnv } from './open-from-env.js';

/**
 * The demo accounts. Development only: the passwords are public (they are in the README).
 * alice is an `admin`, bob is not; their roles go into access tokens that carry a scope acting with
 * them (`stock:write`, `events:read`, `events:write`), and into no others.
 */
export const demoUsers = [
  {
    id: 'user-alice',
    username: 'alice',
    password: 'alice-demo-password',
    name: 'Alice Liddell',
    email: 'alice@example.com',
    roles: ['admin'],
  },
  {
    id: 'user-bob',
    username: 'bob',
    password: 'bob-demo-password',
    name: 'Bob Builder',
    email: 'bob@example.com',
    roles: [],
  },
] as const;

/** The third-party app's client id (confidential, `client_secret_basic`). */
export const appClientId = 'photo-app';

/** A public client (no secret, PKCE only) for native apps and command-line tools on loopback. */
export const publicClientId = 'cli-pkce';

/** What {@link seed} registers the third-party app with. */
export interface SeedOptions {
  /** The third-party app's callback, e.g. `http://localhost:8083/callback`. */
  appRedirectUri: string;
  /** Where the app sends the browser after the provider's logout; defaults to the redirect URI's origin. */
  appPostLogoutUri?: string;
}

/** The credentials the third-party app needs, read back from the database. */
export interface SeededClients {
  app: { clientId: string; clientSecret: string; redirectUri: string };
  publicClient: { clientId: string; redirectUri: string };
}

/**
 * Seeds the demo data: users alice and bob, the third-party app's confidential client and a public
 * PKCE client. Safe to run on every start: users are kept, the app's secret is generated once and
 * kept, and its redirect URI follows the port the app listens on.
 *
 * @example
 * ```ts
 * const clients = await seed(db, { appRedirectUri: 'http://localhost:8083/callback' });
 * ```
 */
export async function seed(db: Database, options: SeedOptions): Promise<SeededClients> {
  await migrateIdp(db);
  for (const user of demoUsers) await createUser(db, { ...user, roles: [...user.roles] });

  const appClient = (clientSecret: string): ClientMetadata => ({
    client_id: appClientId,
    client_secret: clientSecret,
    client_name: 'Photo app (third-party demo)',
    application_type: 'web',
    redirect_uris: [options.appRedirectUri],
    post_logout_redirect_uris: [options.appPostLogoutUri ?? new URL('/', options.appRedirectUri).href],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  });
  // The secret is made by the first start and kept. Two first starts at once (two replicas) must
  // agree on it, since each hands it to its own app: the first insert wins, both read it back.
  await addClientIfMissing(db, appClient(randomBytes(32).toString('base64url')));
  const clientSecret = (await findClient(db, appClientId))?.client_secret;
  if (typeof clientSecret !== 'string') throw new Error(`the ${appClientId} client has no secret`);
  // Its redirect URI follows the port this start listens on.
  await saveClient(db, appClient(clientSecret));

  // Native-app style (RFC 8252): loopback redirect, any port at run time.
  const publicRedirect = 'http://127.0.0.1/callback';
  await saveClient(db, {
    client_id: publicClientId,
    client_name: 'Command-line tool (public PKCE client)',
    application_type: 'native',
    redirect_uris: [publicRedirect],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'none',
  });

  return {
    app: { clientId: appClientId, clientSecret, redirectUri: options.appRedirectUri },
    publicClient: { clientId: publicClientId, redirectUri: publicRedirect },
  };
}

// `npm run seed`: seed the database `npm start` uses (DATABASE_URL, or PGlite in DATA_DIR or the
// default folder) without starting anything, registering the app's callback where `npm start` does.
async function seedFromCommandLine(env: NodeJS.ProcessEnv): Promise<void> {
  // Read as `npm start` reads them, so a seed registers the redirect URI the app then sends.
  const appUrl = envUrl(env, 'APP_URL') ?? `http://localhost:${envPort(env, 'APP_PORT', 8083)}`;
  const db = await openDatabaseFromEnv(env);
  try {
    await seed(db, { appRedirectUri: new URL('/callback', appUrl).href });
  } finally {
    await db.close();
  }
  console.log('Seeded users alice and bob and the demo clients.');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  seedFromCommandLine(process.env).catch((error: unknown) => {
    // A configuration mistake is one line naming the variable, as from `npm start`.
    console.error(error instanceof ConfigError ? error.message : error);
    process.exitCode = 1;
  });
}
