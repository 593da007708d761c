import { createHash, randomBytes } from 'node:crypto';
import type { Database } from '../db.js';

/** One sign-in in progress: everything the callback must check, used once and then deleted. */
export interface PendingSignIn {
  state: string;
  nonce: string;
  codeVerifier: string;
  returnTo: string;
}

/** What the user sees from the ID token. */
export interface SignedInUser {
  sub: string;
  name?: string;
  email?: string;
}

/** Tokens, kept on the server only. `expiresAt` is epoch milliseconds by the app's clock. */
export interface SessionTokens {
  accessToken: string;
  refreshToken?: string;
  idToken?: string;
  expiresAt: number;
  scope?: string;
}

/** A one-shot message shown on the next page (post/redirect/get). */
export interface Flash {
  title: string;
  lines: string[];
  /** After a charge: what "Send the same charge again" re-sends, with the same key. */
  repeat?: { key: string; amount: number; currency: string };
}

/** Everything one browser session holds. */
export interface SessionData {
  pending?: PendingSignIn;
  user?: SignedInUser;
  tokens?: SessionTokens;
  flash?: Flash;
}

/**
 * Server-side sessions on the shared database.
 *
 * @example
 * ```ts
 * const sessions = createSessionStore(db, { ttlSeconds: 3600 });
 * const id = await sessions.create({ pending });
 * const data = await sessions.get(id);
 * ```
 */
export interface SessionStore {
  create(data: SessionData): Promise<string>;
  get(id: string | undefined): Promise<SessionData | undefined>;
  save(id: string, data: SessionData): Promise<void>;
  destroy(id: string | undefined): Promise<void>;
}

const hashId = (id: string) => createHash('sha256').update(id).digest('base64url');

/**
 * Creates a {@link SessionStore}. Ids are 256 random bits; only their hash is stored.
 *
 * @example
 * ```ts
 * const sessions = createSessionStore(db, { ttlSeconds: 8 * 3600 });
 * ```
 */
export function createSessionStore(db: Database, options: { ttlSeconds: number }): SessionStore {
  const ttl = Math.max(1, Math.floor(options.ttlSeconds));
  return {
    async create(data) {
      const id = randomBytes(32).toString('base64url');
      await db.query(
        `insert into app_sessions (id_hash, data, expires_at) values ($1, $2, now() + make_interval(secs => $3::int))`,
        [hashId(id), JSON.stringify(data), ttl],
      );
      return id;
    },
    async get(id) {
      if (!id) return undefined;
      const { rows } = await db.query<{ data: SessionData }>(
        'select data from app_sessions where id_hash = $1 and expires_at > now()',
        [hashId(id)],
      );
      return rows[0]?.data;
    },
    async save(id, data) {
      await db.query(
        `update app_sessions set data = $2, expires_at = now() + make_interval(secs => $3::int) where id_hash = $1`,
        [hashId(id), JSON.stringify(data), ttl],
      );
    },
    async destroy(id) {
      if (!id) return;
      await db.query('delete from app_sessions where id_hash = $1', [hashId(id)]);
    },
  };
}
