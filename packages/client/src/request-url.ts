import type { RequestOptions } from './client-options.js';

/**
 * Checks a `baseUrl` option and normalizes it: an absolute http(s) URL without query, fragment or
 * credentials, returned as origin and path without a trailing slash.
 *
 * @example
 * normalizeBaseUrl('https://api.example.com/v1/'); // 'https://api.example.com/v1'
 */
export function normalizeBaseUrl(value: string | URL): string {
  let url: URL;
  try {
    url = new URL(String(value));
  } catch {
    throw new TypeError('baseUrl must be an absolute URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new TypeError('baseUrl must be an http or https URL');
  if (url.search !== '' || url.hash !== '') throw new TypeError('baseUrl must not have a query or a fragment');
  // The normalized URL keeps origin and path only: credentials in it would be dropped without a word
  // (and fetch refuses a URL that holds them).
  if (url.username !== '' || url.password !== '') {
    throw new TypeError('baseUrl must not hold credentials: send them with headers or getToken');
  }
  return `${url.origin}${url.pathname.replace(/\/+$/, '')}`;
}

/**
 * The URL one request goes to: `path` under `baseUrl` (a normalized one), with `query` appended.
 * Throws a `TypeError` for a path that would leave `baseUrl`: an absolute URL, or a dot segment.
 *
 * @example
 * requestUrl('https://api.example.com/v1', '/stock', { item: 'sku-1' }); // 'https://api.example.com/v1/stock?item=sku-1'
 */
export function requestUrl(baseUrl: string, path: string, query: RequestOptions['query']): string {
  if (typeof path !== 'string') throw new TypeError('path must be a string');
  // An absolute URL would send the bearer token to whatever host it names.
  if (/^[a-z][a-z\d+.-]*:/i.test(path) || path.startsWith('//')) {
    throw new TypeError('path must be relative to baseUrl; create another client for another origin');
  }
  // A dot segment (`..`, or `%2e%2e` as encodeURIComponent leaves it) climbs out of baseUrl's path:
  // `get('/photos/' + encodeURIComponent(id))` with an id of `..` would reach another endpoint of
  // the API with the caller's token. URLs treat `\` as `/`, so it splits segments too.
  const segments = (path.split(/[?#]/, 1)[0] ?? '').split(/[\\/]/);
  if (segments.some((segment) => /^(?:\.|%2e){1,2}$/i.test(segment))) {
    throw new TypeError("path must not hold a '.' or '..' segment (nor %2e): it would name another resource");
  }
  const url = new URL(`${baseUrl}/${path.replace(/^\/+/, '')}`);
  if (query instanceof URLSearchParams) {
    query.forEach((value, name) => {
      url.searchParams.append(name, value);
    });
  } else if (query !== undefined) {
    for (const [name, value] of Object.entries(query)) {
      if (value === undefined) continue;
      for (const item of Array.isArray(value) ? value : [value]) url.searchParams.append(name, String(item));
    }
  }
  return url.href;
}
