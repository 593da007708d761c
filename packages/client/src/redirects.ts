import { drainBody, drainCapBytes } from './drain-body.js';
import type { FetchFunction } from './fetch-function.js';
import { normalizeMethod } from './retry-decision.js';

// What fetch allows before it gives up on a chain of redirects (WHATWG Fetch, "HTTP-redirect fetch").
const maxRedirects = 20;

const redirectStatuses: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);

// How long a redirect's body may take to end once its headers came: about what a new connection
// costs (a few round trips). A body that stalls longer is given up, and the next hop takes a new
// connection rather than the whole attempt's timeout.
const redirectDrainMs = 250;

// The headers that describe a request body: dropped with the body when a redirect turns the request
// into a GET, as fetch does.
const bodyHeaders = ['content-type', 'content-encoding', 'content-language', 'content-location'];

// Credentials fetch itself drops on a redirect to another origin; the client adds its own list.
const credentialHeaders = ['authorization', 'cookie', 'cookie2', 'proxy-authorization'];

/**
 * A Location as fetch reads it. Headers hold one Latin-1 character per byte, so a Location a server
 * sent as raw UTF-8 (some do, unencoded) arrives as mojibake, and resolving it as it is would go to
 * `/caf%C3%83%C2%A9` instead of `/caf%C3%A9`. undici and browsers read the bytes of such a value as
 * UTF-8; so does this, when a character outside printable ASCII shows the value is not encoded.
 */
function asUtf8(location: string): string {
  if (!/[^\x20-\x7e]/.test(location)) return location;
  const bytes = Uint8Array.from(location, (char) => char.charCodeAt(0) & 0xff);
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    // Not UTF-8 either (a Latin-1 `ü`, one byte): read as the characters it holds, where undici
    // would decode it to U+FFFD and fail the redirect.
    return location;
  }
}

// The redirects a read could not follow, with why. fetch rejects such a read with a TypeError, which
// a retrying client cannot tell from a dropped connection: it would repeat a loop of 21 requests, or
// a Location it can never follow, on every attempt. Returned instead, the 3xx is the server's
// answer, the same on every attempt, and its Location stays readable (an app's own scheme).
const unfollowedRedirects = new WeakMap<Response, TypeError>();

function unfollowed(response: Response, reason: TypeError, hops: number): Response {
  if (hops > 0) Object.defineProperty(response, 'redirected', { value: true });
  unfollowedRedirects.set(response, reason);
  return response;
}

/**
 * Why a read's redirect was not followed (a 21st hop, a Location that is no http(s) URL), for the
 * 3xx {@link followingRedirects} answered with instead of rejecting; `undefined` for any other response.
 *
 * @example
 * const reason = unfollowedRedirect(response); // TypeError('redirect count exceeded')
 */
export function unfollowedRedirect(response: Response): TypeError | undefined {
  return unfollowedRedirects.get(response);
}

/**
 * A fetch for reads that follows redirects itself, as fetch would, except that on a hop to another
 * origin it drops `dropAcrossOrigins` (the names of the client-wide `headers`) and the credential
 * headers, for that hop and every later one. A redirect it does not follow (past 20 hops, or to a
 * Location that is no http(s) URL) is answered with that 3xx, unread, where fetch would reject (see
 * {@link unfollowedRedirect}). fetch drops only Authorization and cookies, so an API
 * key set once on the client went to whatever origin a GET's 302 named; the client refuses absolute
 * paths so that credentials stay on baseUrl's origin, and a redirect must not undo that.
 *
 * Where redirects are opaque to scripts (a browser answers `redirect: 'manual'` with an
 * `opaqueredirect`), the runtime is known by that answer, not guessed from its globals (jsdom and
 * SSR shims give Node a `document`, and Node's fetch would then carry the client's headers across
 * origins): a GET or HEAD that met the opaque redirect is sent again with `redirect: 'follow'` (one
 * more request) without the client-wide headers, since where the browser takes it cannot be read
 * (an origin that allows any header would get an API key set once on the client), an unkeyed PUT or
 * DELETE, which has already run, ends with `redirect_unreadable`, as a write does, rather than being
 * run a second time, and every later read of this client that carries none of the client-wide
 * headers is sent with `redirect: 'follow'` from the start (one that carries them is asked with
 * `'manual'` first, as before): the browser follows under its own rules, dropping Authorization and
 * cookies on a hop to another origin.
 *
 * @example
 * const get = followingRedirects(fetch, ['x-api-key']);
 * await get('https://api.example.com/stock', { method: 'GET', headers: { 'x-api-key': 'k' } });
 */
export function followingRedirects(fetchFn: FetchFunction, dropAcrossOrigins: readonly string[]): FetchFunction {
  const own = [...new Set(dropAcrossOrigins.map((name) => name.toLowerCase()))];
  const dropped = [...new Set([...credentialHeaders, ...own])];
  // Where the browser follows, the client cannot see where a hop goes: a read that met an opaque
  // redirect is sent again without the client-wide headers, on every hop, its own origin's
  // included. fetch drops Authorization and cookies on a hop to another origin by itself.
  const followed = (input: string, init: RequestInit) => {
    const headers = new Headers(init.headers);
    for (const name of own) headers.delete(name);
    return fetchFn(input, { ...init, headers, redirect: 'follow' });
  };
  // Set once a fetch of this client answered with an opaque redirect.
  let opaque = false;
  return async (input, init) => {
    // A read with none of the client-wide headers has nothing to lose on a hop: the browser follows.
    // One with them is asked with 'manual' first (no cost unless it is redirected), so that they
    // never go where a redirect points.
    if (opaque && !own.some((name) => new Headers(init.headers).has(name))) {
      return fetchFn(input, { ...init, redirect: 'follow' });
    }
    const origin = new URL(input).origin;
    let url = input;
    let method = normalizeMethod(init.method ?? 'GET');
    let body = init.body;
    const headers = new Headers(init.headers);
    let leftOrigin = false;
    for (let hops = 0; ; hops++) {
      const response = await fetchFn(url, { ...init, method, body, headers, redirect: 'manual' });
      if (response.type === 'opaqueredirect') {
        opaque = true;
        // What create-client ends with redirect_unreadable: the request ran, and where the redirect
        // points cannot be read.
        // A QUERY is safe (IETF draft httpbis-safe-method-w-body): sending it again runs nothing twice.
        if (method !== 'GET' && method !== 'HEAD' && method !== 'QUERY') return response;
        return followed(input, init);
      }
      const location = response.headers.get('location');
      if (!redirectStatuses.has(response.status) || location === null) {
        // As fetch reports a followed chain (callers read it to tell a moved resource).
        if (hops > 0) Object.defineProperty(response, 'redirected', { value: true });
        return response;
      }
      if (hops >= maxRedirects) return unfollowed(response, new TypeError('redirect count exceeded'), hops);
      let next: URL;
      try {
        next = new URL(asUtf8(location), url);
      } catch (error) {
        return unfollowed(response, new TypeError('the redirect location is not a URL', { cause: error }), hops);
      }
      if (next.protocol !== 'http:' && next.protocol !== 'https:') {
        return unfollowed(response, new TypeError(`a redirect to a ${next.protocol} URL is not followed`), hops);
      }
      // The redirect itself is not the answer, but its body is read to its end (up to 64 KiB, and
      // redirectDrainMs) before the next hop: cancelled, it made undici close the socket whenever it
      // had not fully arrived, and every hop opened a new connection. The attempt's signal (its
      // timeout, the caller's abort) ends the drain too, even under a fetch whose body ignores it.
      const drain = drainBody(response, drainCapBytes, redirectDrainMs);
      if (init.signal?.aborted) drain.cancel();
      else init.signal?.addEventListener('abort', drain.cancel, { once: true });
      await drain.done;
      init.signal?.removeEventListener('abort', drain.cancel);
      // Aborted meanwhile: no further hop. A fetch that honours its signal would refuse it anyway; one
      // that ignores it would send it after the caller gave up.
      init.signal?.throwIfAborted();
      // 303 turns anything but GET and HEAD into a GET; 301 and 302 turn a POST into one (fetch's
      // rule, kept for the browser compatibility it encodes). 307 and 308 keep method and body. A
      // QUERY follows the draft that defines it: a 303 points at the result, fetched with GET; any
      // other redirect repeats the QUERY, body and all, at the new URL.
      if (
        (response.status === 303 && method !== 'GET' && method !== 'HEAD') ||
        (response.status <= 302 && method === 'POST')
      ) {
        method = 'GET';
        body = undefined;
        for (const name of bodyHeaders) headers.delete(name);
      }
      if (next.origin !== origin) leftOrigin = true;
      // Once the chain has left the origin the credentials stay off, even if it comes back: the
      // hops in between could have pointed it anywhere.
      // A client-wide Content-Type (or another body header) is no credential: it goes on with the body
      // it describes, or the other origin gets that body typed as whatever fetch guesses.
      if (leftOrigin) {
        for (const name of dropped) if (body === undefined || !bodyHeaders.includes(name)) headers.delete(name);
      }
      url = next.href;
    }
  };
}
