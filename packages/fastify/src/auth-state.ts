// What the guard glue knows of a request, shared with the idempotency middleware of this package
// (not exported from the package).
import type { Guard, GuardError } from '@idem/guard';
import type { FastifyReply, FastifyRequest } from 'fastify';

// The guard that authenticated a request (or, `optional`, let it through as anonymous), so
// `authorize()` and the idempotency plugin answer with the same realm. A property under a symbol of this
// module, not a WeakMap: an entry per request in a weak collection is work for every scavenge.
const guardKey = Symbol('@idem/fastify guard');
type Guarded = FastifyRequest & { [guardKey]?: Guard };
export const guardOf = {
  get: (request: FastifyRequest): Guard | undefined => (request as Guarded)[guardKey],
  set: (request: FastifyRequest, guard: Guard): void => {
    (request as Guarded)[guardKey] = guard;
  },
};

/**
 * The guard that let `request` through as anonymous (`optional`), or undefined: for the idempotency
 * plugin, which then answers 401 with that guard's challenge instead of `scope_missing`.
 */
export function anonymousGuardOf(request: FastifyRequest): Guard | undefined {
  return request.auth === undefined || request.auth === null ? guardOf.get(request) : undefined;
}

/** Answers a guard's refusal: its status, `WWW-Authenticate` challenge and problem+json. */
export function sendGuardError(reply: FastifyReply, error: GuardError): FastifyReply {
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
