import { randomUUID } from 'node:crypto';
import type { Database } from '../db.js';
import { credentialText } from '../text.js';
import { hashPassword } from './passwords.js';

/**
 * An account of the identity provider. `roles` (for example `admin`) go into the access tokens that
 * carry a scope acting with them (`roleScopes` in `scopes.ts`).
 */
export interface User {
  id: string;
  username: string;
  passwordHash: string;
  name: string;
  email: string;
  roles: string[];
}

/**
 * The longest username and password the login form takes. Longer input is refused, never cut: a cut
 * password would let anything that starts with the stored one's first 1024 characters in.
 */
export const maxUsernameLength = 200;
export const maxPasswordLength = 1024;

/** What {@link createUser} needs; the password is hashed before it touches the database. */
export interface NewUser {
  username: string;
  password: string;
  name: string;
  email: string;
  roles?: string[];
  /** A stable subject identifier; a random UUID when absent. */
  id?: string;
}

interface UserRow {
  id: string;
  username: string;
  password_hash: string;
  name: string;
  email: string;
  roles: string[];
}

function fromRow(row: UserRow): User {
  return {
    id: row.id,
    username: row.username,
    passwordHash: row.password_hash,
    name: row.name,
    email: row.email,
    roles: row.roles,
  };
}

/**
 * Inserts a user unless one with that username exists; returns the stored user either way.
 *
 * @example
 * ```ts
 * const alice = await createUser(db, { username: 'alice', password: 'wonderland', name: 'Alice', email: 'alice@example.com' });
 * ```
 */
export async function createUser(db: Database, given: NewUser): Promise<User> {
  // Stored in the one spelling the login form looks up (NFC, see credentialText); the password is
  // normalised by hashPassword, and measured here as it will be typed in.
  const user = { ...given, username: credentialText(given.username), password: credentialText(given.password) };
  // An account the login form could never sign in to is refused here rather than created.
  if (user.username.length > maxUsernameLength) {
    throw new TypeError(`createUser: a username has at most ${maxUsernameLength} characters`);
  }
  if (user.password.length > maxPasswordLength) {
    throw new TypeError(`createUser: a password has at most ${maxPasswordLength} characters`);
  }
  const existing = await findUserByUsername(db, user.username);
  if (existing) return existing;
  const passwordHash = await hashPassword(user.password);
  const id = user.id ?? randomUUID();
  // No conflict target: the id is unique too, and two starts seeding one account at once meet on
  // whichever key they reach first; a target of `username` alone let the id clash through as 23505.
  await db.query(
    `insert into idp_users (id, username, password_hash, name, email, roles)
     values ($1, $2, $3, $4, $5, $6) on conflict do nothing`,
    [id, user.username, passwordHash, user.name, user.email, user.roles ?? []],
  );
  const stored = await findUserByUsername(db, user.username);
  if (!stored) throw new Error(`createUser: the id ${id} belongs to another user than ${user.username}`);
  return stored;
}

/**
 * Looks a user up by login name.
 *
 * @example
 * ```ts
 * const user = await findUserByUsername(db, 'alice');
 * ```
 */
export async function findUserByUsername(db: Database, username: string): Promise<User | undefined> {
  // Stored in NFC since the credentials were normalised; a row an earlier version stored as typed in
  // the decomposed spelling (NFD) is found too, after the NFC one if both exist (an earlier version
  // kept them apart), so its owner is not locked out by the upgrade. The login rewrites it in NFC.
  const composed = credentialText(username);
  const decomposed = username.normalize('NFD');
  const { rows } = await db.query<UserRow>(
    'select * from idp_users where username = $1 or username = $2 order by username = $1 desc limit 1',
    [composed, decomposed],
  );
  return rows[0] ? fromRow(rows[0]) : undefined;
}

/**
 * Rewrites an account an earlier version stored in the decomposed spelling (its username or its
 * password hash) in NFC, once its owner signed in with `password`: from then on it is found and
 * verified by the spelling every later lookup uses. The username stays as it is when another account
 * holds its NFC spelling already. Best effort: a failure leaves the account as it was, still usable.
 *
 * @example
 * ```ts
 * if (matched === 'nfd' || user.username !== credentialText(user.username)) await upgradeCredentials(db, user, password);
 * ```
 */
export async function upgradeCredentials(db: Database, user: User, password: string): Promise<void> {
  const passwordHash = await hashPassword(password);
  await db.query(
    `update idp_users set password_hash = $2,
            username = case when exists (select 1 from idp_users where username = $3) then username else $3 end
      where id = $1`,
    [user.id, passwordHash, credentialText(user.username)],
  );
}

/**
 * Looks a user up by subject identifier (the `sub` claim).
 *
 * @example
 * ```ts
 * const user = await findUserById(db, token.accountId);
 * ```
 */
export async function findUserById(db: Database, id: string): Promise<User | undefined> {
  const { rows } = await db.query<UserRow>('select * from idp_users where id = $1', [id]);
  return rows[0] ? fromRow(rows[0]) : undefined;
}
