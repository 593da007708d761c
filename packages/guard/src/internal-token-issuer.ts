import { type JWK, SignJWT } from 'jose';
import { internalTokenType } from './guard-typ.js';
import { type InternalSigningKey, signingKeyRing, toSigningEntry } from './internal-signing-keys.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';
import type { Principal } from './principal.js';
import { seconds } from './seconds.js';

/**
 * Mints the gateway's internal tokens and publishes their keys.
 *
 * @example
 * const token = await issuer.mint(principal, { audience: 'orders-service' });
 */
export interface InternalTokenIssuer {
  readonly issuer: string;
  /** The kid of the key that signs now (after a `rotate()`, the previous one until the delay has passed). */
  readonly currentKid: string;
  /** Mints a token for one upstream (`aud`) carrying the caller's identity. */
  mint(principal: Principal, options: { audience: string }): Promise<string>;
  /**
   * The public keys as a JWKS, for services to verify with (serve it, or pass it to
   * `createInternalVerifier`): a key waiting to sign, the current one, and older ones while their
   * tokens may still verify (and up to `maxPublishedKeys`, except keys an immediate rotation
   * withdrew). Ask again after a `rotate()`.
   */
  jwks(): { keys: JWK[] };
  /**
   * Publishes `key` (default: a fresh Ed25519 key) in `jwks()` at once and makes it the signing key
   * once `delay` seconds have passed (default: the `rotationDelay` option, 60). The current key signs
   * until then and stays published until its last tokens expired. `delay: 0` switches at once, for a
   * key known to be compromised: the keys before it are withdrawn from `jwks()` once their own tokens
   * expired (not kept for `maxPublishedKeys`), and services that fetched the JWKS within their cooldown
   * refuse the new tokens (`key_unknown`) until it ends. Returns the new kid.
   */
  rotate(key?: InternalSigningKey, options?: { delay?: number | undefined }): string;
}

/**
 * Options of {@link createInternalTokenIssuer}.
 *
 * @example
 * const options: InternalTokenIssuerOptions = { issuer: 'https://gateway.example', ttl: 30 };
 */
export interface InternalTokenIssuerOptions {
  /** The gateway's issuer name (`iss` of every internal token). */
  issuer: string;
  /** Signing keys, newest first; the first signs. Default: one fresh Ed25519 key. */
  keys?: readonly InternalSigningKey[] | undefined;
  /** Lifetime of an internal token in seconds (default 60). */
  ttl?: number | undefined;
  /** Names of further claims copied from the caller's token (e.g. `['email', 'tenant']`). */
  claims?: readonly string[] | undefined;
  /**
   * How many keys `jwks()` keeps publishing, newest first (default 3). A key whose tokens may still
   * verify, or that has yet to sign, is published whatever this says.
   */
  maxPublishedKeys?: number | undefined;
  /**
   * Seconds between `rotate()` publishing a key and the key signing (default 60; 0 to 3600). Make it
   * at least the services' JWKS `cooldown` (default 30) plus any HTTP cache in front of the JWKS, so
   * a service has fetched the new key before the first token that names it (no `key_unknown`).
   */
  rotationDelay?: number | undefined;
  /** Clock in epoch milliseconds (default `Date.now`). */
  now?: (() => number) | undefined;
}

const issuerOptionNames = [
  'issuer',
  'keys',
  'ttl',
  'claims',
  'maxPublishedKeys',
  'rotationDelay',
  'now',
] as const satisfies readonly (keyof InternalTokenIssuerOptions)[];
const issuerOptionNamesAll: NamesAll<InternalTokenIssuerOptions, typeof issuerOptionNames> = true;
void issuerOptionNamesAll;

/** Claims reserved by the internal token; extra claims never overwrite them. */
const reservedClaims = new Set([
  'iss',
  'sub',
  'aud',
  'exp',
  'iat',
  'nbf',
  'jti',
  'scope',
  'roles',
  'client_id',
  'orig_iss',
  'orig_aud',
  'cnf',
  'nonce',
]);

/**
 * The gateway's internal token issuer (research section 4, lesson 2). Tokens are short-lived (60 s),
 * `aud` is the one upstream they are minted for, `iss` is the gateway, `typ` is `internal+jwt` so
 * they never pass as edge tokens (and edge tokens never pass as them), and they carry `sub`, `scope`,
 * `roles`, `client_id`, the original `jti`, and the original `iss`/`aud` as `orig_iss`/`orig_aud`.
 *
 * @example
 * const internal = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
 * const token = await internal.mint(principal, { audience: 'orders-service' });
 * app.get('/.well-known/jwks.json', (_req, res) => res.json(internal.jwks()));
 */
export function createInternalTokenIssuer(options: InternalTokenIssuerOptions): InternalTokenIssuer {
  if (typeof options?.issuer !== 'string' || options.issuer.length === 0) {
    throw new TypeError('createInternalTokenIssuer needs an issuer');
  }
  refuseUnknownOptions(options, issuerOptionNames, 'createInternalTokenIssuer');
  const ttl = options.ttl ?? 60;
  if (!Number.isSafeInteger(ttl) || ttl < 1 || ttl > 3600) throw new TypeError('ttl must be 1 to 3600 seconds');
  const maxPublished = options.maxPublishedKeys ?? 3;
  if (!Number.isSafeInteger(maxPublished) || maxPublished < 1) throw new TypeError('maxPublishedKeys must be ≥ 1');
  const rotationDelay = seconds(options.rotationDelay ?? 60, 'rotationDelay', { max: 3600 });
  const now = options.now ?? Date.now;
  const extraClaims = (options.claims ?? []).filter((name) => !reservedClaims.has(name));
  const configured = options.keys !== undefined && options.keys.length > 0 ? options.keys : [undefined];
  const ring = signingKeyRing(
    configured.map((key) => toSigningEntry(key, Number.NEGATIVE_INFINITY)),
    { ttlMs: ttl * 1000, maxPublished, at: now() },
  );

  return {
    issuer: options.issuer,
    get currentKid() {
      return ring.signer(now()).kid;
    },
    async mint(principal, { audience }) {
      if (typeof audience !== 'string' || audience.length === 0) throw new TypeError('mint needs an audience');
      const at = now();
      const current = ring.signer(at);
      const issuedAt = Math.floor(at / 1000);
      const claims: Record<string, unknown> = {};
      for (const name of extraClaims) if (principal.claims[name] !== undefined) claims[name] = principal.claims[name];
      if (principal.scope.size > 0) claims.scope = [...principal.scope].join(' ');
      if (principal.roles.size > 0) claims.roles = [...principal.roles];
      if (principal.clientId !== undefined) claims.client_id = principal.clientId;
      if (principal.jti !== undefined) claims.jti = principal.jti;
      claims.orig_iss = principal.iss;
      claims.orig_aud = [...principal.aud];
      return new SignJWT(claims)
        .setProtectedHeader({ alg: current.alg, kid: current.kid, typ: internalTokenType })
        .setIssuer(options.issuer)
        .setSubject(principal.sub)
        .setAudience(audience)
        .setIssuedAt(issuedAt)
        .setExpirationTime(issuedAt + ttl)
        .sign(await current.signingKey);
    },
    jwks() {
      return { keys: ring.published(now()).map((entry) => ({ ...entry.publicJwk })) };
    },
    rotate(key, rotateOptions) {
      // Published now, signing later: services pick the key up before any token names it.
      const delay = seconds(rotateOptions?.delay ?? rotationDelay, 'rotate delay', { max: 3600 });
      const at = now();
      const entry = toSigningEntry(key, at + delay * 1000);
      ring.add(entry, at);
      return entry.kid;
    },
  };
}
