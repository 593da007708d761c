import { createHash } from 'node:crypto';

/**
 * The SHA-256 of a bearer value (a session id, a refresh token, a sign-in's state), base64url without
 * padding: what a table keys or keeps in its place, so that whoever reads the database holds nothing
 * to present. The IdP's rows (`idp/stored-id.ts`) and the app's sessions use the same one.
 *
 * @example
 * ```ts
 * sha256Id('abc'); // 'ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0'
 * ```
 */
export function sha256Id(value: string): string {
  return createHash('sha256').update(value).digest('base64url');
}

/**
 * {@link sha256Id} in SQL, of the expression `value`, for rows an earlier version stored in clear
 * (rewritten at start). NULL stays NULL.
 *
 * @example
 * ```ts
 * await db.exec(`update idp_models m set id = ${sha256IdSql('m.id')} where m.model = 'RefreshToken'`);
 * ```
 */
export function sha256IdSql(value: string): string {
  return `translate(rtrim(encode(sha256(convert_to(${value}, 'UTF8')), 'base64'), '='), '+/', '-_')`;
}
