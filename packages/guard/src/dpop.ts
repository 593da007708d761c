import { createHash } from 'node:crypto';
import { assertAlgorithms, type JwsAlgorithm, keyFamilyOf } from './algorithms.js';
import { isNumericDate } from './claims.js';
import { decodeUtf8Strict, isPlainObject, parseCompactJws, type TokenLimits } from './compact-jws.js';
import type { GuardErrorCode } from './errors.js';
import { normalizeTyp } from './guard-typ.js';
import { verifyJwsSignature } from './jws-verify.js';
import { checkJwk, importCheckedKey } from './key-import.js';
import { memoryReplayCache, type ReplayAnswer } from './replay-memory.js';
import { seconds } from './seconds.js';
import { parseStrictJson } from './strict-json.js';

/**
 * DPoP (RFC 9449) settings of a guard. Durations in seconds.
 *
 * @example
 * createGuard({ ...options, dpop: { origin: 'https://api.example', required: true } });
 */
export interface DpopOptions {
  /** Refuse plain Bearer tokens: every request must carry a DPoP-bound token and a proof (default false). */
  required?: boolean;
  /** Accepted proof algorithms (default `['ES256', 'EdDSA', 'PS256', 'RS256']`; asymmetric only). */
  algorithms?: readonly JwsAlgorithm[];
  /** How old a proof's `iat` may be (default 60). The clock tolerance applies on top. */
  maxAge?: number;
  /**
   * The public origin clients call (e.g. `https://api.example`), used to check `htu`. Set it: the
   * default, `http://` plus the Host header, is what the client sends, so without it a proof made for
   * another server with the same path is accepted when the client sends that server's Host. It is
   * also wrong whenever TLS ends in front of the app.
   */
  origin?: string;
  /**
   * Replay memory. Called with a key unique to the proof (`jkt:jti`) and the time it can be forgotten,
   * once the access token has verified and is bound to the proof's key (so requests that authenticate
   * no one never fill it); returns false when the key was already seen, or `'full'` when it cannot be
   * remembered (the proof is then refused with `dpop_replay_full`). A store that throws or rejects
   * refuses the proof with `dpop_replay_unavailable`. Default: in process, at most
   * `maxReplayEntries` proofs. Give a shared store (Redis `SET NX PX`) when several gateways run.
   */
  replay?: (key: string, expiresAtMs: number) => ReplayAnswer | Promise<ReplayAnswer>;
  /**
   * Seconds a `replay` store may take before the proof is refused with `dpop_replay_unavailable`
   * (default 1; 0.01 to 60). A store that hangs must not hang every request behind it.
   */
  replayTimeout?: number;
  /** Bound on the default replay memory (default 100,000); when it is full of live proofs, new ones are refused. */
  maxReplayEntries?: number;
}

/** The checked DPoP settings. */
export interface DpopRuntime {
  required: boolean;
  algorithms: readonly JwsAlgorithm[];
  maxAgeMs: number;
  origin: string | undefined;
  replay: (key: string, expiresAtMs: number) => ReplayAnswer | Promise<ReplayAnswer>;
  replayTimeoutMs: number;
}

/**
 * Checks DPoP options; throws a `TypeError` for bad ones.
 *
 * @example
 * const runtime = buildDpop({ origin: 'https://api.example' }, Date.now);
 */
export function buildDpop(options: DpopOptions, now: () => number): DpopRuntime {
  const algorithms = assertAlgorithms(options.algorithms ?? ['ES256', 'EdDSA', 'PS256', 'RS256'], 'dpop.algorithms');
  if (algorithms.some((alg) => keyFamilyOf(alg) === 'oct')) throw new TypeError('dpop.algorithms must be asymmetric');
  const maxAge = seconds(options.maxAge ?? 60, 'dpop.maxAge', { min: 1, max: 3600 });
  const replayTimeout = seconds(options.replayTimeout ?? 1, 'dpop.replayTimeout', { min: 0.01, max: 60 });
  let origin: string | undefined;
  if (options.origin !== undefined) {
    const url = new URL(options.origin);
    origin = url.origin;
  }
  return {
    required: options.required === true,
    algorithms,
    maxAgeMs: maxAge * 1000,
    origin,
    replay: options.replay ?? memoryReplayCache(options.maxReplayEntries ?? 100_000, now),
    replayTimeoutMs: replayTimeout * 1000,
  };
}

/** Rejects when `pending` has not settled within `ms`; the timer never keeps the process alive. */
function withTimeout<T>(pending: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms}ms`)), ms);
    timer.unref?.();
  });
  return Promise.race([pending, timeout]).finally(() => clearTimeout(timer));
}

// RFC 3986 §2.3: ALPHA, DIGIT, `-`, `.`, `_`, `~`. Percent-encoding one of them changes nothing.
const unreserved = /[A-Za-z0-9\-._~]/;

// RFC 3986 §6.2.2.2: a percent-encoded unreserved character is decoded, every other triplet gets
// upper-case hex digits, so `/%7euser`, `/%7Euser` and `/~user` compare equal, and `%2f` equals `%2F`
// but never `/`.
function normalizePercentEncoding(path: string): string {
  return path.replace(/%([0-9A-Fa-f]{2})/g, (_, hex: string) => {
    const character = String.fromCharCode(Number.parseInt(hex, 16));
    return unreserved.test(character) ? character : `%${hex.toUpperCase()}`;
  });
}

/**
 * `htu` comparison form (RFC 9449 §4.3 asks for RFC 3986 §6.2.2 syntax-based normalisation): the
 * WHATWG URL parser lower-cases scheme and host, drops the default port, resolves `.` and `..`
 * segments and percent-encodes what must be; then percent-encoding is normalised. No query or fragment.
 */
function normalizeHtu(value: string): string | undefined {
  try {
    const url = new URL(value);
    return `${url.protocol}//${url.host}${normalizePercentEncoding(url.pathname)}`;
  } catch {
    return undefined;
  }
}

/** A proof whose checks passed, not yet remembered: the guard records it once the token verifies. */
export interface VerifiedProof {
  /** RFC 7638 thumbprint of the proof's key, matched against the token's `cnf.jkt`. */
  jkt: string;
  /** The replay memory's key for this proof: `jkt:jti`. */
  replayKey: string;
  /** When the proof could no longer pass the `iat` window anyway, so the memory may forget it. */
  expiresAtMs: number;
}

/** What a proof is checked against. */
export interface ProofContext {
  method: string;
  /** The request URL as the client called it (origin + path; the query is ignored). */
  url: string;
  accessToken: string;
  nowMs: number;
  clockToleranceMs: number;
  limits: TokenLimits;
}

/**
 * Verifies a DPoP proof (RFC 9449 §4.3): `typ` `dpop+jwt`, an allowed asymmetric `alg`, a public
 * `jwk` that passes the key checks and verifies the signature, `htm` and `htu` matching the request,
 * `iat` inside the window and `ath` the hash of the access token. Returns the key's thumbprint for the
 * `cnf.jkt` check. The `jti` is not recorded here: {@link rememberProof} does that once the access
 * token has verified, so proofs sent with a worthless token cannot fill the replay memory.
 *
 * @example
 * const proof = await verifyDpopProof(proofJwt, runtime, { method: 'POST', url: 'https://api.example/orders', accessToken, nowMs: Date.now(), clockToleranceMs: 5000, limits });
 */
export async function verifyDpopProof(
  proof: string,
  runtime: DpopRuntime,
  context: ProofContext,
): Promise<({ ok: true } & VerifiedProof) | { ok: false; code: GuardErrorCode }> {
  const invalid = { ok: false, code: 'dpop_proof_invalid' } as const;
  const parsed = parseCompactJws(proof, context.limits);
  if (!parsed.ok) return invalid;
  const { header } = parsed.value;
  if (typeof header.typ !== 'string' || normalizeTyp(header.typ) !== 'dpop+jwt') return invalid;
  const alg = header.alg;
  if (typeof alg !== 'string' || !runtime.algorithms.includes(alg as JwsAlgorithm)) return invalid;
  for (const name of ['crit', 'b64', 'jku', 'x5u', 'x5c', 'zip', 'enc']) if (name in header) return invalid;
  if (!isPlainObject(header.jwk)) return invalid;
  // The proof must carry a public key only (RFC 9449 §4.2); a private member means a leaked key.
  for (const name of ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k']) if (name in header.jwk) return invalid;
  const checked = checkJwk(header.jwk, { algorithms: [alg as JwsAlgorithm], allowSymmetric: false });
  if (!checked.ok || checked.key.alg !== alg) return invalid;
  let key: Awaited<ReturnType<typeof importCheckedKey>>;
  try {
    key = await importCheckedKey(checked.key);
  } catch {
    return invalid;
  }
  const signature = await verifyJwsSignature(parsed.value, alg as JwsAlgorithm, [key]);
  if (!signature.ok) return invalid;

  const text = decodeUtf8Strict(parsed.value.payload);
  const claims = text === undefined ? undefined : parseStrictJson(text, context.limits.maxDepth);
  if (claims === undefined || !claims.ok || !isPlainObject(claims.value)) return invalid;
  const { jti, htm, htu, iat, ath } = claims.value;
  if (typeof jti !== 'string' || jti.length === 0 || jti.length > 256) return invalid;
  if (htm !== context.method) return invalid;
  if (typeof htu !== 'string') return invalid;
  const proofUrl = normalizeHtu(htu);
  if (proofUrl === undefined || proofUrl !== normalizeHtu(context.url)) return invalid;
  if (!isNumericDate(iat)) return invalid;
  const issuedMs = iat * 1000;
  if (issuedMs > context.nowMs + context.clockToleranceMs) return invalid;
  if (context.nowMs - issuedMs > runtime.maxAgeMs + context.clockToleranceMs) return invalid;
  const expectedAth = createHash('sha256').update(context.accessToken).digest('base64url');
  if (ath !== expectedAth) return invalid;

  // The RFC 7638 thumbprint of the proof's key: the `cnf.jkt` a bound token must carry.
  const jkt = key.thumbprint;
  // Remembered until the proof could no longer pass the iat window anyway.
  const expiresAtMs = issuedMs + runtime.maxAgeMs + 2 * context.clockToleranceMs;
  return { ok: true, jkt, replayKey: `${jkt}:${jti}`, expiresAtMs };
}

/**
 * Records a verified proof in the replay memory (the `jti` memory A0 lacks). Returns the refusal:
 * `dpop_proof_replayed` for a proof seen before, `dpop_replay_full` when the memory cannot take it,
 * `dpop_replay_unavailable` when it throws or rejects; `undefined` when the proof is new and now
 * remembered. Call it only after the access token verified and matched the proof's key.
 *
 * @example
 * const refusal = await rememberProof(runtime, proof);
 * if (refusal !== undefined) return refuse(refusal);
 */
export async function rememberProof(runtime: DpopRuntime, proof: VerifiedProof): Promise<GuardErrorCode | undefined> {
  let answer: ReplayAnswer;
  try {
    const pending = runtime.replay(proof.replayKey, proof.expiresAtMs);
    // Any thenable, not only this realm's Promise: a store's client may bring its own.
    answer =
      typeof (pending as { then?: unknown } | null)?.then === 'function'
        ? await withTimeout(Promise.resolve(pending), runtime.replayTimeoutMs)
        : (pending as ReplayAnswer);
  } catch {
    // A store that is down cannot say the proof is new. Refused, never let through, and never thrown
    // out of `authenticate`, where glue would turn it into a 500.
    return 'dpop_replay_unavailable';
  }
  if (answer === true) return undefined;
  return answer === 'full' ? 'dpop_replay_full' : 'dpop_proof_replayed';
}

/**
 * The URL a proof's `htu` must match: the configured origin (or `http://` + Host) and the request path.
 * Without `origin`, the Host header decides the origin, and the client writes it: a proof made for
 * another server (same path) passes when the client sends that server's name as Host. Only the
 * configured `origin` binds proofs to this server.
 *
 * @example
 * requestHtu(runtime, { headers: { host: 'api.example' }, url: '/orders?x=1' }); // 'http://api.example/orders?x=1'
 */
export function requestHtu(
  runtime: DpopRuntime,
  request: { headers: Record<string, string | string[] | undefined>; url?: string },
): string {
  const host = request.headers.host;
  const origin = runtime.origin ?? `http://${typeof host === 'string' ? host : 'invalid.invalid'}`;
  return origin + (typeof request.url === 'string' ? request.url : '/');
}
