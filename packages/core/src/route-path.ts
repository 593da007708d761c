/** How a router compares paths: the two settings Express and @koa/router share. */
export interface RoutePathOptions {
  /** `/Charges` and `/charges` are different routes. Default false (Express, @koa/router). */
  caseSensitive?: boolean;
  /** `/charges/` and `/charges` are different routes. Default false (Express, @koa/router). */
  strict?: boolean;
}

/**
 * A concrete path spelled as a router compares it: lower case unless `caseSensitive`, one trailing
 * slash dropped unless `strict`. An adapter mounted before routing names the operation with it, so
 * `/charges`, `/charges/` and `/CHARGES`, which such a router sends to one handler, are one
 * operation and one key cannot run that handler twice under two spellings. (The fingerprint keeps
 * the path as sent, so a key reused for `/charges/ch_A` and `/charges/ch_a` is answered 422, never
 * replayed.)
 *
 * @example
 * foldRoutePath('/Charges/', {}); // '/charges'
 * foldRoutePath('/Charges/', { caseSensitive: true, strict: true }); // '/Charges/'
 */
export function foldRoutePath(path: string, options: RoutePathOptions): string {
  const spelled = options.caseSensitive ? path : path.toLowerCase();
  // The root keeps its only slash: '/' is a path, '' is not.
  if (options.strict || spelled.length < 2 || !spelled.endsWith('/')) return spelled;
  return spelled.slice(0, -1);
}
