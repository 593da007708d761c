import { checkClaims } from './claims.js';
import { decodeUtf8Strict, isPlainObject, parseCompactJws } from './compact-jws.js';
import { checkConfirmation, type PresentedBinding } from './confirmation.js';
import { rememberProof, type VerifiedProof } from './dpop.js';
import type { EngineConfig } from './engine.js';
import { GuardError, type GuardErrorCode } from './errors.js';
import type { GuardRequest } from './extract-token.js';
import { normalizeTyp } from './guard-typ.js';
import { checkJwsHeader, verifyJwsSignature } from './jws-verify.js';
import type { KeySource } from './key-source.js';
import { presentedThumbprint } from './mtls.js';
import type { Principal } from './principal.js';
import { parseStrictJson } from './strict-json.js';

/**
 * What `authenticate` and `verify` return: a principal, or the error to answer with.
 *
 * @example
 * const result: GuardResult = await guard.verify(token);
 * if (!result.ok) console.log(result.error.code);
 */
export type GuardResult =
  | {
      ok: true;
      principal: Principal;
      /** A fresh DPoP nonce for the client's next proof (`dpop.nonce`), for the `DPoP-Nonce` response header. */
      dpopNonce?: string;
    }
  | { ok: false; error: GuardError };

// A refusal: counted and reported, then answered. A module function rather than a closure made per
// verification, which would cost an allocation on every request, refused or not.
function refuse(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  code: GuardErrorCode,
  issuer?: string,
): GuardResult {
  engine.emit({ type: 'rejected', code, ...(issuer === undefined ? {} : { issuer }), at: engine.now() });
  const scheme = binding === undefined ? {} : { scheme: 'DPoP' as const };
  return { ok: false, error: new GuardError(code, { ...engine.errorOptions, ...scheme }) };
}

// Success: a DPoP proof is remembered only now, once its token verified and is bound to its key, so
// requests that authenticate no one never fill the replay memory nor push a real proof id out of it.
async function accept(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  principal: Principal,
  issuer: string,
  cached: boolean,
  at: number,
): Promise<GuardResult> {
  if (binding !== undefined) {
    // A proof is only ever verified where DPoP is on, so the runtime is there; fail closed all the
    // same, as with a replay memory that cannot answer.
    const refusal =
      engine.dpop === undefined ? 'dpop_replay_unavailable' : await rememberProof(engine.dpop, binding, engine.now());
    if (refusal !== undefined) return refuse(engine, binding, refusal, issuer);
  }
  // The configured issuer, never `principal.iss`: behind the gateway that is a claim (`orig_iss`).
  engine.emit({ type: 'authenticated', issuer, cached, at });
  return { ok: true, principal };
}

// What the request proved it holds: the DPoP proof's key, and where `mtls` is on, the thumbprint of
// its client certificate, read once and only when a token bound to one asks for it. A token string
// (`verify`) comes with no request, so with no certificate.
function presentedBinding(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  request: GuardRequest | undefined,
): PresentedBinding {
  const jkt = binding?.jkt;
  const mtls = engine.mtls;
  if (mtls === undefined) return jkt === undefined ? {} : { jkt };
  let read = false;
  let thumbprint: string | undefined;
  const certificate = () => {
    if (!read) {
      read = true;
      thumbprint = request === undefined ? undefined : presentedThumbprint(mtls, request);
    }
    return thumbprint;
  };
  return jkt === undefined ? { certificate } : { jkt, certificate };
}

// The JWS compact serialization in canonical base64url: three segments of [A-Za-z0-9_-] joined by
// dots, no padding. Anything else is malformed whatever follows, so it is refused before the cache.
const compactJwsAlphabet = /^[A-Za-z0-9_.-]+$/;

/**
 * The verification pipeline, cheapest checks first and every outcome a value:
 * size and alphabet → cache → split and decode (canonical base64url, UTF-8, strict JSON) → issuer by
 * exact `iss` → header (alg, crit, refused parameters, typ) → alg on the issuer's list (before any
 * JWKS fetch) → key by exact `kid` (a configured key without one matches any) → signature → claims →
 * principal → cache (unless the issuer retired a key meanwhile) → DPoP proof remembered.
 * Claims are only read for `iss` (to pick the keys) before the signature has verified.
 *
 * @example
 * const result = await verifyWithEngine(token, engine);
 */
export async function verifyWithEngine(
  token: string,
  engine: EngineConfig,
  binding?: VerifiedProof,
  request?: GuardRequest,
): Promise<GuardResult> {
  // `verify` is documented never to throw for bad input, and JavaScript callers can pass anything.
  if (typeof token !== 'string') return refuse(engine, binding, 'token_malformed');
  if (token.length > engine.limits.maxTokenLength) return refuse(engine, binding, 'token_too_large');
  if (!compactJwsAlphabet.test(token)) return refuse(engine, binding, 'token_malformed');
  // A DPoP-bound result is cached under the token and its key together, apart from bearer results:
  // same token, other key or no proof, no hit.
  const cached = engine.cache?.get(token, binding?.jkt, engine.now());
  const presented = presentedBinding(engine, binding, request);
  if (cached !== undefined) {
    // The cache holds the token, not the connection it came on: a certificate binding is checked on
    // every request, a hit too (the DPoP key is part of the cache key already).
    if (presented.certificate !== undefined) {
      const refusal = checkConfirmation(cached.principal.claims.cnf, presented);
      if (refusal !== undefined) return refuse(engine, binding, refusal, cached.issuer);
    }
    const at = engine.now();
    // A hit starts the refresh a lookup would have started, so the keys behind hits stay current.
    engine.issuers.get(cached.issuer)?.keys.refreshIfDue();
    return accept(engine, binding, cached.principal, cached.issuer, true, at);
  }
  const parsed = parseCompactJws(token, engine.limits);
  if (!parsed.ok) return refuse(engine, binding, parsed.reason === 'too-large' ? 'token_too_large' : 'token_malformed');
  const payloadText = decodeUtf8Strict(parsed.value.payload);
  if (payloadText === undefined) return refuse(engine, binding, 'token_malformed');
  const payloadJson = parseStrictJson(payloadText, engine.limits.maxDepth);
  if (!payloadJson.ok || !isPlainObject(payloadJson.value)) return refuse(engine, binding, 'token_malformed');
  const payload = payloadJson.value;

  const issuerName = payload.iss;
  const issuer = typeof issuerName === 'string' ? engine.issuers.get(issuerName) : undefined;
  if (issuer === undefined) return refuse(engine, binding, 'issuer_unknown');

  const header = checkJwsHeader(parsed.value.header, issuer.crit);
  if (!header.ok) return refuse(engine, binding, header.code, issuer.issuer);
  const { alg, kid, typ } = header.header;
  const normalizedTyp = typ === undefined ? null : normalizeTyp(typ);
  if (normalizedTyp !== null && engine.refusedTypes.has(normalizedTyp))
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  if (issuer.typ !== undefined && !issuer.typ.has(normalizedTyp))
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  // An ID token presented as an access token (RFC 8725 §3.12): refused even where `typ` is lax.
  if (normalizedTyp !== 'at+jwt' && payload.nonce !== undefined)
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  if (!issuer.algorithms.includes(alg)) return refuse(engine, binding, 'algorithm_not_allowed', issuer.issuer);

  // Read before the lookup: a refresh that retires a key while this verification still holds the old
  // set (a lookup answered, the signature check not finished) moves it, and the result is not cached.
  const epoch = engine.cache?.epoch(issuer.issuer) ?? 0;
  let lookup: Awaited<ReturnType<KeySource['lookup']>>;
  try {
    lookup = await issuer.keys.lookup(kid, alg);
  } catch {
    return refuse(engine, binding, 'keys_unavailable', issuer.issuer);
  }
  if (lookup.kind === 'unknown-kid') return refuse(engine, binding, 'key_unknown', issuer.issuer);
  if (lookup.kind === 'alg-mismatch') return refuse(engine, binding, 'algorithm_not_allowed', issuer.issuer);
  if (lookup.kind === 'unavailable') return refuse(engine, binding, 'keys_unavailable', issuer.issuer);

  let signature = await verifyJwsSignature(parsed.value, alg, lookup.keys);
  if (!signature.ok && signature.code === 'signature_invalid' && issuer.keys.recheck !== undefined) {
    // New material under a known kid (a replaced key) would otherwise be refused until the cached set
    // expires, up to a day; the source refetches once per cooldown, as for an unknown kid.
    const untried = await issuer.keys.recheck(kid, alg, lookup.keys).catch(() => undefined);
    if (untried) signature = await verifyJwsSignature(parsed.value, alg, untried);
  }
  if (!signature.ok) return refuse(engine, binding, signature.code, issuer.issuer);

  const nowMs = engine.now();
  const claimError = checkClaims(payload, issuer.profile, nowMs, presented);
  if (claimError !== undefined) return refuse(engine, binding, claimError, issuer.issuer);

  const principal = engine.principal(payload, issuer);
  if (engine.cache !== undefined) {
    let expiresAt = (payload.exp as number) * 1000;
    if (issuer.profile.maxTokenAge !== undefined) {
      expiresAt = Math.min(expiresAt, ((payload.iat as number) + issuer.profile.maxTokenAge) * 1000);
    }
    engine.cache.set(token, binding?.jkt, principal, expiresAt, issuer.issuer, epoch);
  }
  return accept(engine, binding, principal, issuer.issuer, false, nowMs);
}
