/**
 * The `fetch` the client calls: the standard one, or any function with its shape.
 *
 * @example
 * createClient({ baseUrl, fetch: (url, init) => fetch(url, { ...init, credentials: 'include' }) });
 */
export type FetchFunction = (input: string, init: RequestInit) => Promise<Response>;
