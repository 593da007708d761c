// The client address in the single-value spellings proxies and CDNs write, and every header
// request-ip (the library most Node services take the client address from) reads: it reads
// `fastly-client-ip` before `true-client-ip` and `x-real-ip`, so one left out is the one it believes.
const clientAddressHeaders = [
  'x-real-ip',
  'true-client-ip',
  'cf-connecting-ip',
  'x-client-ip',
  'fastly-client-ip',
  'x-cluster-client-ip',
  'x-forwarded',
  'forwarded-for',
  'x-appengine-user-ip',
  'cf-pseudo-ipv4',
] as const;

// What well-known authenticating proxies write for the services behind them: a service deployed
// behind one of them (or moved from one) may still trust these. Apache and CGI `REMOTE_USER` and
// its kin; Authelia and Authentik forward auth (their `X-Authenticated-*` is in the `x-auth*`
// family below); Kong (its consumers, and its OIDC plugin's `X-Userinfo`, `X-Access-Token`,
// `X-ID-Token`); Pomerium; the verified token an API gateway passes on (Envoy's and Istio's
// `forward_payload_header` as commonly named, WSO2's `X-JWT-Assertion`); Google IAP and ESP; Azure
// App Service authentication; AWS ALB; Cloudflare Access.
const authenticatingProxyHeaders = [
  'x-remote-*',
  'remote-user',
  'remote-groups',
  'remote-email',
  'remote-name',
  'x-consumer-*',
  'x-credential-identifier',
  'x-access-token',
  'x-id-token',
  'x-pomerium-*',
  'x-jwt-*',
  'x-goog-authenticated-user-*',
  'x-goog-iap-jwt-assertion',
  'x-endpoint-api-userinfo',
  'x-ms-client-principal*',
  'x-amzn-oidc-*',
  'cf-access-*',
] as const;

/**
 * The default identity header families removed from client requests (spec 5.4). `Forwarded` and
 * `X-Forwarded-*` are among them: an upstream that trusts its proxy (the gateway) reads the client
 * address, host and scheme from them, and the family also carries identity (`X-Forwarded-Email`,
 * `-Groups`, `-Client-Cert`). A client must not be able to write either; see `keepForwarded`.
 *
 * @example
 * stripIdentityHeaders(headers, { namespaces: [...defaultIdentityHeaders, 'x-tenant-*'] });
 */
export const defaultIdentityHeaders = [
  // Each family without its `-`, so its root and the hyphenless spellings go too: `X-User` (Ory
  // Oathkeeper's example), `X-UserId`, `X-Userinfo`, a bare `X-Auth`, `X-Authorization`.
  'x-auth*',
  'x-user*',
  'x-internal*',
  'forwarded',
  'x-forwarded-*',
  ...clientAddressHeaders,
  ...authenticatingProxyHeaders,
  'idem-internal-token',
] as const;

// What `keepForwarded` lets through: the proxy headers that say where a request came from, exactly as
// a proxy writes them. Underscore spellings are not among them (a server that reads `_` as `-` would
// take a client's `X_Forwarded_For` for the proxy's), nor is any identity header of the family.
const proxyHeaders: ReadonlySet<string> = new Set([
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'x-forwarded-port',
  'x-forwarded-prefix',
  ...clientAddressHeaders,
]);

/**
 * Options of {@link stripIdentityHeaders}.
 *
 * @example
 * const options: StripOptions = { extra: ['x-tenant-*'] };
 */
export interface StripOptions {
  /**
   * Header families to remove: an exact name, or a prefix ending in `*` (`x-user-*`). Matching is
   * case-insensitive and treats `_` as `-`. Default {@link defaultIdentityHeaders}.
   */
  namespaces?: readonly string[] | undefined;
  /** Families added to the defaults (or to `namespaces`). */
  extra?: readonly string[] | undefined;
  /**
   * Keep `Forwarded` and `X-Forwarded-For`, `-Host`, `-Proto`, `-Port`, `-Prefix` (default false). Set it
   * only when a proxy you trust in front of the gateway writes them (overwrites, or appends to a chain
   * the upstream counts hops in); the rest of the `x-forwarded-*` family is removed all the same.
   */
  keepForwarded?: boolean | undefined;
}

/** Lower case with `_` read as `-`: how proxies and CGI-style servers may alias a header name. */
function normalizeName(name: string): string {
  return name.toLowerCase().replaceAll('_', '-');
}

/**
 * Builds a matcher for header families. Used by stripping and by the internal token header check.
 *
 * @example
 * const matches = identityHeaderMatcher(['x-user-*']);
 * matches('X_User_Id'); // true
 */
export function identityHeaderMatcher(families: readonly string[]): (name: string) => boolean {
  const exact = new Set<string>();
  const prefixes: string[] = [];
  for (const family of families) {
    if (typeof family !== 'string' || family.length === 0)
      throw new TypeError('header families must be non-empty strings');
    const normalized = normalizeName(family);
    if (normalized.endsWith('*')) prefixes.push(normalized.slice(0, -1));
    else exact.add(normalized);
  }
  return (name) => {
    const normalized = normalizeName(name);
    return exact.has(normalized) || prefixes.some((prefix) => normalized.startsWith(prefix));
  };
}

/**
 * Returns a copy of `headers` without any header of the identity families, by namespace rather than by
 * name: `X-User-Id`, `x_user_id`, `X-USER-ID` and duplicated values all go (oauth2-proxy
 * CVE-2025-64484 was the underscore variant getting through). The input is not modified.
 *
 * @example
 * stripIdentityHeaders({ 'x-user-id': 'admin', x_user_role: 'root', accept: 'application/json' });
 * // { accept: 'application/json' }
 */
export function stripIdentityHeaders<T extends string | string[] | number | undefined>(
  headers: Readonly<Record<string, T>>,
  options: StripOptions = {},
): Record<string, T> {
  const families = identityHeaderMatcher(options.namespaces ?? defaultIdentityHeaders);
  // What the caller adds is stripped whatever `keepForwarded` says: it keeps the families' proxy
  // headers, never a header asked for by name.
  const extra =
    options.extra !== undefined && options.extra.length > 0 ? identityHeaderMatcher(options.extra) : undefined;
  const keepForwarded = options.keepForwarded === true;
  const result: Record<string, T> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || extra?.(name)) continue;
    if (families(name) && !(keepForwarded && proxyHeaders.has(name.toLowerCase()))) continue;
    result[name] = value;
  }
  return result;
}
