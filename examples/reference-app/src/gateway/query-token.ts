/**
 * True when the request target `url` carries the RFC 6750 §2.3 `access_token` query parameter, under
 * any percent-encoding of its name (`access%5Ftoken` is the same parameter to the services behind),
 * with or without a value. The gateway reads tokens from the `Authorization` header only; a request
 * that also holds one in its query is refused before forwarding, so no token reaches a service's (or
 * a proxy's) access log through the URL.
 *
 * @example
 * ```ts
 * hasQueryToken('/photos?access_token=eyJ...'); // true
 * hasQueryToken('/photos?token=x'); // false
 * ```
 */
export function hasQueryToken(url: string): boolean {
  const question = url.indexOf('?');
  // The parameter names as URLSearchParams decodes them, as the guard reads an allowed query token.
  return question !== -1 && new URLSearchParams(url.slice(question + 1)).has('access_token');
}
