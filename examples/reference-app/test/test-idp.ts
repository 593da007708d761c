// The identity provider and the third-party app as `npm start` starts them (migrations, seed, both
// servers), on ephemeral ports and the test file's own database, with the seeded clients' credentials
// as the flows in flow.ts take them. Shared by the provider's HTTP-level test files; what a file
// adds (a user, a rigged second provider) stays in that file.
import { type Database, openDatabase } from '../src/db.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import type { Credentials } from './flow.js';
import { openTestDatabase } from './services.js';

/** The gateway URL the provider binds its access tokens to (the resource indicator). */
export const resource = 'http://localhost:8080';

/** The seeded demo users, as a login form takes them. */
export const alice = { username: 'alice', password: demoUsers[0].password };
export const bob = { username: 'bob', password: demoUsers[1].password };

/** A running provider and app, their database, and the seeded clients. */
export interface TestIdp {
  readonly db: Database;
  readonly running: RunningReferenceApp;
  /** The third-party app's confidential client: its secret and its registered redirect URI. */
  readonly app: Required<Credentials>;
  /** The native public client, on a loopback port of its own choosing (RFC 8252 section 7.3). */
  readonly cli: Credentials;
  /** Closes the app and the provider, then the database (dropping a PostgreSQL schema). */
  close(): Promise<void>;
}

/**
 * Starts the provider and the app for the test file `name` (it names the PostgreSQL schema when
 * DATABASE_URL is set, see services.ts). `embedded: true` takes an in-memory PGlite whatever the
 * environment, for a file that must share nothing with the suites running beside it.
 *
 * @example
 * ```ts
 * let idp: TestIdp;
 * beforeAll(async () => {
 *   idp = await startTestIdp('idp');
 * }, 60_000);
 * afterAll(() => idp?.close());
 * ```
 */
export async function startTestIdp(name: string, options: { embedded?: boolean } = {}): Promise<TestIdp> {
  const db = options.embedded ? await openDatabase({ memory: true }) : await openTestDatabase(name);
  let running: RunningReferenceApp;
  try {
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: resource });
  } catch (error) {
    // A start that failed half way must not leave the file's schema behind.
    await db.close().catch(() => undefined);
    throw error;
  }
  const { app, publicClient } = running.clients;
  return {
    db,
    running,
    app: { clientId: app.clientId, clientSecret: app.clientSecret, redirectUri: app.redirectUri },
    cli: { clientId: publicClient.clientId, redirectUri: 'http://127.0.0.1:4321/callback' },
    async close() {
      await running.close();
      await db.close();
    },
  };
}
