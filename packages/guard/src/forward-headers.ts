import { defaultInternalTokenHeader } from './internal-header.js';
import type { InternalTokenIssuer } from './internal-token-issuer.js';
import type { Principal } from './principal.js';
import { type StripOptions, stripIdentityHeaders } from './strip-headers.js';

/**
 * Options of {@link forwardHeaders}.
 *
 * @example
 * const options: ForwardOptions = { issuer: internalTokens, audience: 'orders-service' };
 */
export interface ForwardOptions extends StripOptions {
  /** The gateway's internal token issuer. */
  issuer: InternalTokenIssuer;
  /** The upstream the request goes to: the internal token's `aud`. */
  audience: string;
  /** Header carrying the internal token (default `idem-internal-token`); always stripped first. */
  header?: string | undefined;
  /**
   * Keep the caller's `Authorization` header and its `DPoP` proof (default false: neither reaches the
   * upstream). They go together: a DPoP-bound token is of no use without its proof.
   */
  keepAuthorization?: boolean | undefined;
}

/**
 * The headers a gateway sends upstream: the incoming headers without every identity family
 * (case-, underscore- and duplicate-proof), without the caller's credentials (`Authorization` and
 * the `DPoP` proof; `Cookie` is kept: the guard reads none), without hop-by-hop
 * headers (`connection` and those it names, `keep-alive`, `te`, `trailer`, `transfer-encoding`,
 * `upgrade`), `expect`, `proxy-authorization` and `host`, plus a freshly minted internal token for
 * `audience`. `content-length` is kept for a body passed on as it came: drop it when you send a
 * re-encoded one. `Idempotency-Key` is kept even when `Connection` names it (a client may not name
 * an end-to-end field there, RFC 9110 §7.6.1): dropped, every retry of the operation would reach the
 * upstream without its key, and run again under a minted one. The input is not modified.
 *
 * @example
 * // after the guard, so req.auth is set
 * const headers = await forwardHeaders(req.headers, req.auth!, { issuer: internal, audience: 'orders-service' });
 * await fetch('http://orders.internal' + req.url, { method: req.method, headers: joinHeaderValues(headers) });
 */
export async function forwardHeaders<T extends string | string[] | number | undefined>(
  incoming: Readonly<Record<string, T>>,
  principal: Principal,
  options: ForwardOptions,
): Promise<Record<string, T | string>> {
  const header = (options.header ?? defaultInternalTokenHeader).toLowerCase();
  const stripped: Record<string, T | string> = stripIdentityHeaders(incoming, {
    ...(options.namespaces === undefined ? {} : { namespaces: options.namespaces }),
    extra: [...(options.extra ?? []), header],
    keepForwarded: options.keepForwarded === true,
  });
  if (options.keepAuthorization !== true) {
    // The DPoP proof is a credential too (RFC 9449 §4): signed by the caller's key for the gateway's
    // URL, of no use to an upstream, and a leak wherever that upstream logs or relays its headers.
    for (const name of Object.keys(stripped)) if (callerCredentials.has(name.toLowerCase())) delete stripped[name];
  }
  dropHopByHop(stripped, keptWhenNamed);
  // `Expect` is no hop-by-hop field, but the server in front of the gateway has answered it already
  // (Node sends `100 Continue` before the body is read); passed on, fetch and undici refuse the request.
  for (const name of Object.keys(stripped)) if (name.toLowerCase() === 'expect') delete stripped[name];
  stripped[header] = await options.issuer.mint(principal, { audience: options.audience });
  return stripped;
}

// What the guard reads as the caller's credentials, dropped unless `keepAuthorization`.
const callerCredentials: ReadonlySet<string> = new Set(['authorization', 'dpop']);

// Headers about one connection, not the message (RFC 9110 section 7.6.1; HTTP/2's pseudo-headers
// go too, see dropHopByHop), and `host`, which names
// the gateway: the client that makes the upstream request writes its own. Passed on, they break that
// request (fetch refuses `transfer-encoding` and a `connection` it did not choose) or mislead the
// upstream (its virtual host is the gateway's name). `proxy-authorization` is a credential for the
// next proxy inbound, the gateway (RFC 9110 section 11.7.2): passed on, it would leak to the upstream.
const hopByHop: ReadonlySet<string> = new Set([
  'connection',
  'proxy-connection',
  'keep-alive',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'proxy-authorization',
]);

/**
 * An upstream's response headers as a gateway passes them on to its client: without the hop-by-hop
 * headers (`connection` and those it names, `keep-alive`, `te`, `trailer`, `transfer-encoding`,
 * `upgrade`, and the request-only `host` and `proxy-authorization`). They describe the gateway's own
 * connection to the upstream (RFC 9110 §7.6.1): copied, the upstream's `connection: keep-alive`
 * overrides the client's `Connection: close`, and its `keep-alive: timeout=…` announces a timeout the
 * gateway does not keep. The input is not modified.
 *
 * @example
 * reply.from(upstreamUrl, { rewriteHeaders: (headers) => withoutHopByHop(headers) });
 */
export function withoutHopByHop<T>(headers: Readonly<Record<string, T>>): Record<string, T> {
  const copy = { ...headers };
  dropHopByHop(copy);
  return copy;
}

// A request's end-to-end fields that `Connection` cannot take away (see forwardHeaders).
const keptWhenNamed: ReadonlySet<string> = new Set(['idempotency-key']);

/** Removes, in place, the hop-by-hop headers and those the `Connection` header names (but `kept`). */
function dropHopByHop(headers: Record<string, unknown>, kept: ReadonlySet<string> = new Set()): void {
  const named = new Set<string>();
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() !== 'connection') continue;
    for (const part of (Array.isArray(value) ? value : [value]).join(',').split(',')) {
      const token = part.trim().toLowerCase();
      if (token.length > 0 && !kept.has(token)) named.add(token);
    }
  }
  for (const name of Object.keys(headers)) {
    const lower = name.toLowerCase();
    // HTTP/2 pseudo-headers (`:method`, `:path`, `:authority`, `:scheme`, `:status`) frame one
    // message of one connection (RFC 9113 8.3), and Node's compatibility API lists them with the
    // others: passed on, fetch refuses the name and the gateway answers 500.
    if (hopByHop.has(lower) || named.has(lower) || lower.startsWith(':')) delete headers[name];
  }
}

/**
 * Turns a header map into plain strings for `fetch` or `http.request`: Node already joins repeated
 * request headers, and whatever is still an array is joined with `, ` (RFC 9110 §5.3).
 *
 * @example
 * joinHeaderValues({ accept: ['a', 'b'], host: 'x' }); // { accept: 'a, b', host: 'x' }
 */
export function joinHeaderValues(
  headers: Readonly<Record<string, string | string[] | number | undefined>>,
): Record<string, string> {
  const result: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) result[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return result;
}
