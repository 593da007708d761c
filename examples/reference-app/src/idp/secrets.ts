import type { JsonWebKey } from 'node:crypto';
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import type { Database } from '../db.js';

/**
 * Returns the secret stored under `name`, creating it with `create` on first use. Two processes racing
 * on a fresh database both try to insert; `on conflict do nothing` plus a re-read makes them agree.
 */
async function loadOrCreate<T>(db: Database, name: string, create: () => T): Promise<T> {
  const read = async () => {
    const { rows } = await db.query<{ value: T }>('select value from idp_secrets where name = $1', [name]);
    return rows[0]?.value;
  };
  const existing = await read();
  if (existing !== undefined) return existing;
  await db.query('insert into idp_secrets (name, value) values ($1, $2) on conflict (name) do nothing', [
    name,
    JSON.stringify(create()),
  ]);
  const stored = await read();
  if (stored === undefined) throw new Error(`idp secret ${name} could not be stored`);
  return stored;
}

/** A private signing key in JWK form, as oidc-provider's `jwks` option takes it. */
export type SigningJwk = JsonWebKey & { kid: string; alg: string; use: 'sig' };

/**
 * The provider's signing keys: generated once (RSA 2048, RS256) and kept in the database, never in the
 * repository, so tokens stay valid across restarts and every process of one deployment signs alike.
 *
 * @example
 * ```ts
 * const keys = await loadSigningKeys(db);
 * new Provider(issuer, { jwks: { keys } });
 * ```
 */
export function loadSigningKeys(db: Database): Promise<SigningJwk[]> {
  return loadOrCreate(db, 'signing-keys', () => {
    const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const jwk = privateKey.export({ format: 'jwk' });
    return [{ ...jwk, kid: randomUUID(), alg: 'RS256', use: 'sig' as const }];
  });
}

/**
 * The keys oidc-provider signs its cookies with (Keygrip), generated once and kept in the database.
 *
 * @example
 * ```ts
 * new Provider(issuer, { cookies: { keys: await loadCookieKeys(db) } });
 * ```
 */
export function loadCookieKeys(db: Database): Promise<string[]> {
  return loadOrCreate(db, 'cookie-keys', () => [randomBytes(32).toString('base64url')]);
}

/**
 * The key the login and consent pages derive their CSRF tokens from.
 *
 * @example
 * ```ts
 * const csrf = createCsrf(await loadCsrfKey(db));
 * ```
 */
export function loadCsrfKey(db: Database): Promise<string> {
  return loadOrCreate(db, 'csrf-key', () => randomBytes(32).toString('base64url'));
}
