/** How a router compares paths: the two settings Express and @koa/router share. */
export interface RoutePathOptions {
  /** `/Charges` and `/charges` are different routes. Default false (Express, @koa/router). */
  caseSensitive?: boolean | undefined;
  /** `/charges/` and `/charges` are different routes. Default false (Express, @koa/router). */
  strict?: boolean | undefined;
}

/**
 * A concrete path spelled as a router compares it: lower case unless `caseSensitive`, one trailing
 * slash dropped unless `strict`. An adapter mounted before routing names the operation with it, so
 * `/charges`, `/charges/` and `/CHARGES`, which such a router sends to one handler, are one
 * operation and one key cannot run that handler twice under two spellings. So are `/evt_1` and
 * `/evt%5F1` (see {@link normalisePercentEncoding}). (The fingerprint keeps the path's case and
 * slashes, so a key reused for `/charges/ch_A` and `/charges/ch_a` is answered 422, never replayed.)
 *
 * @example
 * foldRoutePath('/Charges/', {}); // '/charges'
 * foldRoutePath('/Charges/', { caseSensitive: true, strict: true }); // '/Charges/'
 */
export function foldRoutePath(path: string, options: RoutePathOptions): string {
  const decoded = normalisePercentEncoding(path);
  const spelled = options.caseSensitive ? decoded : decoded.toLowerCase();
  // The root keeps its only slash: '/' is a path, '' is not.
  if (options.strict || spelled.length < 2 || !spelled.endsWith('/')) return spelled;
  return spelled.slice(0, -1);
}

/**
 * A path with its percent-encodings spelled one way (RFC 3986 6.2.2.1 and 6.2.2.2): an encoded
 * unreserved character (a letter, a digit, `-`, `.`, `_`, `~`) decoded, every other escape in upper
 * case. `/evt_1`, `/evt%5F1` and `/evt%5f1` are one URI, and routers hand the handler the same
 * decoded parameters for each, so they must be one operation and one fingerprint: otherwise a retry
 * spelled another way would run the operation again under the same key. An encoded reserved character
 * (`%2F`, `%3F`) stays encoded: it is not the character itself.
 *
 * @example
 * normalisePercentEncoding('/evt%5f1/a%2fb'); // '/evt_1/a%2Fb'
 */
export function normalisePercentEncoding(path: string): string {
  if (path.indexOf('%') === -1) return path;
  return path.replace(/%[0-9A-Fa-f]{2}/g, (encoded) => {
    const code = Number.parseInt(encoded.slice(1), 16);
    return isUnreserved(code) ? String.fromCharCode(code) : encoded.toUpperCase();
  });
}

function isUnreserved(code: number): boolean {
  return (
    (code >= 0x61 && code <= 0x7a) || // a-z
    (code >= 0x41 && code <= 0x5a) || // A-Z
    (code >= 0x30 && code <= 0x39) || // 0-9
    code === 0x2d || // -
    code === 0x2e || // .
    code === 0x5f || // _
    code === 0x7e // ~
  );
}

/**
 * A request target as its origin form: `http://host/r?q` is `/r?q`. A forward proxy sends the
 * absolute form (RFC 9112 3.2.2), which routers route by its path: the adapters fingerprint that
 * path alone, so a retry sent in origin form is the same request, not a 422.
 *
 * @example
 * originForm('http://api.example/charges?a=1'); // '/charges?a=1'
 */
export function originForm(url: string): string {
  if (url.startsWith('/')) return url;
  const authority = url.indexOf('://');
  if (authority === -1) return url;
  const pathAt = url.indexOf('/', authority + 3);
  const queryAt = url.indexOf('?', authority + 3);
  if (pathAt === -1 || (queryAt !== -1 && queryAt < pathAt)) return `/${queryAt === -1 ? '' : url.slice(queryAt)}`;
  return url.slice(pathAt);
}
