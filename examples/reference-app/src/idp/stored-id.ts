import { sha256Id } from '../sha256-id.js';

/**
 * The models whose rows in `idp_models` are keyed by their id as oidc-provider gives it. Every other
 * model's id is a value a client or a browser presents to use it (a refresh token, an authorization
 * code, an opaque access token, the sign-in session's cookie, an interaction's cookie, a pushed
 * request's URI), and its row is keyed by {@link storedId} instead, so that whoever reads the database
 * (a backup, a read replica, an SQL injection elsewhere) holds nothing to present.
 *
 * - `Grant`: its id is no credential (tokens name it), and other rows point at it by `grant_id`;
 * - `Client`: the client id, public (`clients.ts` reads and writes these rows itself);
 * - `ReplayDetection`: the ids of DPoP proofs and client assertions already seen, which no one can
 *   present again (that is what the model refuses);
 * - `DeviceCode`: the device flow (off here) finds its code by the user code and saves it again, and
 *   a row found so cannot be given back its id. Turning the flow on needs that settled first.
 *
 * @example
 * ```ts
 * idsKeptAsGiven.includes('Grant'); // true: a grant's row is keyed by its id
 * ```
 */
export const idsKeptAsGiven: readonly string[] = ['Grant', 'Client', 'ReplayDetection', 'DeviceCode'];

/**
 * The key of model `model`'s row with id `id`: the id itself for the models in {@link idsKeptAsGiven},
 * its SHA-256 in base64url for every other one (as the app's own sessions keep `id_hash`). The ids
 * hashed are random, about 256 bits each (oidc-provider's 43 characters of nanoid): no salt or slow
 * hash is needed for a value no one can guess.
 *
 * @example
 * ```ts
 * const key = storedId('RefreshToken', token);
 * await db.query(`select payload from idp_models where model = 'RefreshToken' and id = $1`, [key]);
 * ```
 */
export function storedId(model: string, id: string): string {
  return idsKeptAsGiven.includes(model) ? id : sha256Id(id);
}

/**
 * What is stored of `payload`, the model's as oidc-provider gives it, under {@link storedId}: no copy of
 * the id it is keyed by. oidc-provider puts the id in `jti`, and an Interaction keeps it at the end of
 * `returnTo` (its resume URL) and the sign-in session's cookie in `session.cookie`, which nothing reads
 * back. {@link payloadAsRead} gives back what `find` must return.
 *
 * @example
 * ```ts
 * JSON.stringify(payloadAtRest('RefreshToken', token, payload)); // the payload without `jti`
 * ```
 */
export function payloadAtRest<Payload extends Record<string, unknown>>(model: string, id: string, payload: Payload) {
  if (idsKeptAsGiven.includes(model)) return payload;
  const { jti: _id, ...stored }: Record<string, unknown> = payload;
  if (model !== 'Interaction') return stored;
  if (typeof stored.session === 'object' && stored.session !== null) {
    const { cookie: _cookie, ...session } = stored.session as Record<string, unknown>;
    stored.session = session;
  }
  if (typeof stored.returnTo === 'string' && stored.returnTo.endsWith(`/${id}`)) {
    stored.returnTo = stored.returnTo.slice(0, -id.length);
  }
  return stored;
}

/**
 * A payload {@link payloadAtRest} stored, as oidc-provider reads it when it finds the model by `id`:
 * the id back in `jti` (and at the end of an Interaction's `returnTo`). A Session found by its `uid`
 * instead has no id to get back: oidc-provider only reads such a one (the account and grant a token
 * or an interaction belongs to), and gives it a new random id of its own, which a save would store
 * apart from the session, never over it.
 *
 * @example
 * ```ts
 * return payloadAsRead('RefreshToken', token, row.payload); // `jti: token` again
 * ```
 */
export function payloadAsRead<Payload extends Record<string, unknown>>(model: string, id: string, payload: Payload) {
  if (idsKeptAsGiven.includes(model)) return payload;
  const read: Record<string, unknown> = { ...payload, jti: id };
  if (model === 'Interaction' && typeof read.returnTo === 'string' && read.returnTo.endsWith('/')) {
    read.returnTo = `${read.returnTo}${id}`;
  }
  return read as Payload;
}
