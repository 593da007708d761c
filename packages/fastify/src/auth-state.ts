// What the guard glue knows of a request, shared with the idempotency middleware of this package
// (not exported from the package).
import type { Guard, GuardError } from '@idem/guard';
import type { FastifyReply, FastifyRequest, RawServerBase, RouteGenericInterface } from 'fastify';

/**
 * A request, or a reply, of any server Fastify makes: HTTP/1.1, HTTPS or HTTP/2 (`http2: true`). The
 * glue reads only what all of them have (headers, url, method), so its hooks take all of them.
 * Fastify's defaults name an HTTP/1 server, whose raw request has `headersDistinct`, which an
 * HTTP/2 request lacks: typed with those, the hooks were refused on an `http2: true` instance (TS2322).
 */
export type AnyServerRequest = FastifyRequest<RouteGenericInterface, RawServerBase>;
export type AnyServerReply = FastifyReply<RouteGenericInterface, RawServerBase>;

// The guard that authenticated a request (or, `optional`, let it through as anonymous), so
// `authorize()` and the idempotency plugin answer with the same realm. A property under a symbol of this
// module, not a WeakMap: an entry per request in a weak collection is work for every scavenge.
const guardKey = Symbol('@idem/fastify guard');
type Guarded = AnyServerRequest & { [guardKey]?: Guard };
export const guardOf = {
  get: (request: AnyServerRequest): Guard | undefined => (request as Guarded)[guardKey],
  set: (request: AnyServerRequest, guard: Guard): void => {
    (request as Guarded)[guardKey] = guard;
  },
};

/**
 * The guard that let `request` through as anonymous (`optional`), or undefined: for the idempotency
 * plugin, which then answers 401 with that guard's challenge instead of `scope_missing`.
 */
export function anonymousGuardOf(request: AnyServerRequest): Guard | undefined {
  return request.auth === undefined || request.auth === null ? guardOf.get(request) : undefined;
}

/** Answers a guard's refusal: its status, `WWW-Authenticate` challenge and problem+json. */
export function sendGuardError(reply: AnyServerReply, error: GuardError): AnyServerReply {
  // `use_dpop_nonce` brings the nonce to retry with (RFC 9449 §9).
  if (error.dpopNonce !== undefined) reply.header('DPoP-Nonce', error.dpopNonce);
  // Bytes, not a string: Fastify adds `; charset=utf-8` to a JSON type sent as a string, and the
  // other adapters, idem's own problems and the guard docs say `application/problem+json`.
  return reply
    .code(error.status)
    .header('WWW-Authenticate', error.wwwAuthenticate)
    .header('Cache-Control', 'no-store')
    .type('application/problem+json')
    .send(Buffer.from(JSON.stringify(error.toProblem())));
}
