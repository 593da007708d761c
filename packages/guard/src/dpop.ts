import { createHash, createHmac, createSecretKey, randomBytes, timingSafeEqual } from 'node:crypto';
import { assertAlgorithms, type JwsAlgorithm, keyFamilyOf } from './algorithms.js';
import { isNumericDate } from './claims.js';
import { decodeUtf8Strict, isPlainObject, parseCompactJws, type TokenLimits } from './compact-jws.js';
import type { GuardErrorCode } from './errors.js';
import { normalizeTyp } from './guard-typ.js';
import { verifyJwsSignature } from './jws-verify.js';
import { checkJwk, importCheckedKey } from './key-import.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';
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
  required?: boolean | undefined;
  /** Accepted proof algorithms (default `['ES256', 'EdDSA', 'Ed25519', 'PS256', 'RS256']`; asymmetric only). */
  algorithms?: readonly JwsAlgorithm[] | undefined;
  /** How old a proof's `iat` may be (default 60). The clock tolerance applies on top. */
  maxAge?: number | undefined;
  /**
   * The public origin clients call (e.g. `https://api.example`), used to check `htu`. Set it: the
   * default, `http://` plus the Host header, is what the client sends, so without it a proof made for
   * another server with the same path is accepted when the client sends that server's Host. It is
   * also wrong whenever TLS ends in front of the app.
   */
  origin?: string | undefined;
  /**
   * Replay memory. Called with a key unique to the proof (`jkt:jti`) and the time it can be forgotten,
   * once the access token has verified and is bound to the proof's key (so requests that authenticate
   * no one never fill it); returns false when the key was already seen, or `'full'` when it cannot be
   * remembered (the proof is then refused with `dpop_replay_full`), or `'share-full'` when the proof's
   * key holds its share of the store (`dpop_replay_share_full`). A store that throws or rejects
   * refuses the proof with `dpop_replay_unavailable`. Default: in process, at most
   * `maxReplayEntries` proofs and `maxReplayEntriesPerKey` of one key. Give a shared store (Redis
   * `SET NX PX`) when several gateways run; it bounds itself, and should give each key (the key's
   * part before the first `:`) a share of its own, or one client can fill it for all the others
   * (`maxReplayEntries` or `maxReplayEntriesPerKey` with a store is a `TypeError`).
   */
  replay?: ((key: string, expiresAtMs: number) => ReplayAnswer | Promise<ReplayAnswer>) | undefined;
  /**
   * Seconds a `replay` store may take before the proof is refused with `dpop_replay_unavailable`
   * (default 1; 0.01 to 60). A store that hangs must not hang every request behind it. Only with
   * `replay` (without it, a `TypeError`: the in-process memory answers at once).
   */
  replayTimeout?: number | undefined;
  /**
   * Bound on the in-process replay memory (default 100,000); when it is full of live proofs, new ones
   * are refused. Not with `replay` (a `TypeError`): a store of one's own is bounded by its own means.
   */
  maxReplayEntries?: number | undefined;
  /**
   * How many live proofs of one key (the token's `cnf.jkt`) the in-process memory holds once it is half
   * full (default a hundredth of `maxReplayEntries`, at least 1: 1,000, about 14 requests a second of
   * one key with the default 70 s a proof is remembered; below half, no key is held back, so a busy
   * client is refused only while the memory is under pressure). Past it, that key's new proofs are refused with
   * `dpop_replay_share_full` until its own proofs expire, and other keys still get in: without it,
   * one holder of a bound token could fill the whole memory and lock every other client out. At most
   * `maxReplayEntries` (equal to it: no share). Not with `replay` (a `TypeError`), like `maxReplayEntries`.
   */
  maxReplayEntriesPerKey?: number | undefined;
  /**
   * Require a nonce this server provides in every proof (RFC 9449 §9): `true`, or `{ secret,
   * lifetime }`. A proof without one, or with one past its time, is refused with 401
   * `dpop_nonce_required` (`error="use_dpop_nonce"`) and the current nonce in `DPoP-Nonce`, which the
   * client puts in its retry. Proofs then cannot be made ahead of time: a key stolen for a while
   * signs nothing that outlives the nonce. A nonce names a window of `lifetime` seconds (default
   * 300) and passes in that window and the next; a request whose nonce is of the last window gets
   * the current one in `DPoP-Nonce` with its answer. Nonces are an HMAC of the time window under `secret` (at least 32 bytes), so gateways that
   * share it take each other's; the default is a random secret of this process.
   */
  nonce?: boolean | { secret?: string | Uint8Array | undefined; lifetime?: number | undefined } | undefined;
}

const dpopOptionNames = [
  'required',
  'algorithms',
  'maxAge',
  'origin',
  'replay',
  'replayTimeout',
  'maxReplayEntries',
  'maxReplayEntriesPerKey',
  'nonce',
] as const satisfies readonly (keyof DpopOptions)[];
const dpopNamesAll: NamesAll<DpopOptions, typeof dpopOptionNames> = true;
void dpopNamesAll;

/** The server's DPoP nonces (RFC 9449 §9): made from the time window, checked without state. */
export interface DpopNonces {
  /** The nonce of the window `nowMs` falls in. */
  current(nowMs: number): string;
  /**
   * `'current'` or `'previous'` for a nonce of this or the last window, else `'invalid'`. A nonce of
   * the next window is `'current'` while `nowMs + toleranceMs` is in it: another gateway with the
   * same secret and a clock that far ahead made it.
   */
  check(nonce: unknown, nowMs: number, toleranceMs?: number): 'current' | 'previous' | 'invalid';
}

/** The checked DPoP settings. */
export interface DpopRuntime {
  required: boolean;
  algorithms: readonly JwsAlgorithm[];
  maxAgeMs: number;
  origin: string | undefined;
  replay: (key: string, expiresAtMs: number) => ReplayAnswer | Promise<ReplayAnswer>;
  replayTimeoutMs: number;
  /** Set when proofs must carry a server nonce. */
  nonces: DpopNonces | undefined;
}

/**
 * Checks DPoP options; throws a `TypeError` for bad ones.
 *
 * @example
 * const runtime = buildDpop({ origin: 'https://api.example' }, Date.now);
 */
export function buildDpop(options: DpopOptions, now: () => number): DpopRuntime {
  if (options === null || typeof options !== 'object') throw new TypeError('dpop must be an object');
  refuseUnknownOptions(options, dpopOptionNames, 'dpop');
  const algorithms = assertAlgorithms(
    options.algorithms ?? ['ES256', 'EdDSA', 'Ed25519', 'PS256', 'RS256'],
    'dpop.algorithms',
  );
  if (algorithms.some((alg) => keyFamilyOf(alg) === 'oct')) throw new TypeError('dpop.algorithms must be asymmetric');
  const maxAge = seconds(options.maxAge ?? 60, 'dpop.maxAge', { min: 1, max: 3600 });
  // Each bounds one of the two memories: silently ignored, the other would be a limit the operator
  // believes in and that is not there.
  if (options.replay !== undefined && options.maxReplayEntries !== undefined) {
    throw new TypeError(
      'dpop.maxReplayEntries bounds the in-process replay memory and cannot be combined with dpop.replay: bound your store itself',
    );
  }
  if (options.replay !== undefined && options.maxReplayEntriesPerKey !== undefined) {
    throw new TypeError(
      'dpop.maxReplayEntriesPerKey bounds the in-process replay memory and cannot be combined with dpop.replay: give each key a share in your store itself',
    );
  }
  if (options.replay === undefined && options.replayTimeout !== undefined) {
    throw new TypeError(
      'dpop.replayTimeout applies to a dpop.replay store only: the in-process memory answers at once',
    );
  }
  if (options.replay !== undefined && typeof options.replay !== 'function') {
    throw new TypeError('dpop.replay must be a function');
  }
  const replayTimeout = seconds(options.replayTimeout ?? 1, 'dpop.replayTimeout', { min: 0.01, max: 60 });
  // Read as "not required" otherwise: a typo would let plain bearer tokens through.
  if (options.required !== undefined && typeof options.required !== 'boolean') {
    throw new TypeError('dpop.required must be a boolean');
  }
  let origin: string | undefined;
  if (options.origin !== undefined) {
    // An origin and nothing else: `localhost:3000` parses as a URL of scheme `localhost:` whose origin
    // is "null" (every proof then refused, without a word), and a path would be dropped in silence.
    const url = URL.canParse(String(options.origin)) ? new URL(String(options.origin)) : undefined;
    if (
      url === undefined ||
      (url.protocol !== 'https:' && url.protocol !== 'http:') ||
      url.pathname !== '/' ||
      url.search !== '' ||
      url.hash !== '' ||
      url.username !== '' ||
      url.password !== '' ||
      String(options.origin).endsWith('?') ||
      String(options.origin).endsWith('#')
    ) {
      // Quoted to help the reader, unless it may hold a user name and password (`@`), which the
      // startup log must not keep.
      const given = String(options.origin).includes('@')
        ? 'a value with user information (not shown)'
        : JSON.stringify(options.origin);
      throw new TypeError(
        `dpop.origin must be an http(s) origin such as https://api.example, without a path or credentials: not ${given}`,
      );
    }
    origin = url.origin;
  }
  return {
    required: options.required === true,
    algorithms,
    maxAgeMs: maxAge * 1000,
    origin,
    replay:
      options.replay ?? memoryReplayCache(options.maxReplayEntries ?? 100_000, now, options.maxReplayEntriesPerKey),
    replayTimeoutMs: replayTimeout * 1000,
    nonces: nonceOptions(options.nonce),
  };
}

function nonceOptions(option: DpopOptions['nonce']): DpopNonces | undefined {
  if (option === undefined || option === false) return undefined;
  if (option !== true && (option === null || typeof option !== 'object')) {
    throw new TypeError('dpop.nonce must be true, false or { secret, lifetime }');
  }
  const settings = option === true ? {} : option;
  refuseUnknownOptions(settings, ['secret', 'lifetime'], 'dpop.nonce');
  const lifetime = seconds(settings.lifetime ?? 300, 'dpop.nonce.lifetime', { min: 10, max: 86_400 });
  let secret: Uint8Array;
  if (settings.secret === undefined) secret = randomBytes(32);
  else if (typeof settings.secret === 'string') secret = Buffer.from(settings.secret, 'utf8');
  else if (settings.secret instanceof Uint8Array) secret = settings.secret;
  else throw new TypeError('dpop.nonce.secret must be a string or bytes');
  if (secret.byteLength < 32) throw new TypeError('dpop.nonce.secret must be at least 32 bytes');
  return createDpopNonces(secret, lifetime * 1000);
}

/**
 * Nonces for DPoP proofs: `<window>.<mac>`, the window being the time divided by `lifetimeMs` and the
 * MAC an HMAC-SHA256 of it under `secret`, so any process with the secret makes and checks them
 * without state. A nonce of the current window or the one before it is taken: one made just before
 * a window ends still has a whole window to be used in. So is one of the next window within the
 * clock tolerance of its start, made by a gateway whose clock runs ahead.
 *
 * @example
 * const nonces = createDpopNonces(randomBytes(32), 300_000);
 * nonces.check(nonces.current(Date.now()), Date.now()); // 'current'
 */
export function createDpopNonces(secret: Uint8Array, lifetimeMs: number): DpopNonces {
  // A key object of its own holds a copy: a caller that wipes or reuses its buffer after
  // configuring the guard must not turn the key into zeros that anyone could MAC under.
  const key = createSecretKey(Buffer.from(secret));
  const mac = (window: number) => createHmac('sha256', key).update(`dpop-nonce:${window}`).digest();
  const windowOf = (nowMs: number) => Math.floor(nowMs / lifetimeMs);
  const nonceOf = (window: number) => `${window.toString(36)}.${mac(window).toString('base64url')}`;
  return {
    current: (nowMs) => nonceOf(windowOf(nowMs)),
    check(nonce, nowMs, toleranceMs = 0) {
      // Bounded before any parsing: a window in base 36 and 43 characters of MAC.
      if (typeof nonce !== 'string' || nonce.length > 64) return 'invalid';
      const dot = nonce.indexOf('.');
      if (dot < 1) return 'invalid';
      const window = Number.parseInt(nonce.slice(0, dot), 36);
      const now = windowOf(nowMs);
      const ahead = window === now + 1 && windowOf(nowMs + toleranceMs) === window;
      if (window !== now && window !== now - 1 && !ahead) return 'invalid';
      // Spelled as this server spells it: no second form of one window gets in.
      if (nonce.slice(0, dot) !== window.toString(36)) return 'invalid';
      const given = Buffer.from(nonce.slice(dot + 1), 'base64url');
      const expected = mac(window);
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) return 'invalid';
      // Re-encoded, the MAC must read as sent: base64url has one spelling per byte string.
      if (given.toString('base64url') !== nonce.slice(dot + 1)) return 'invalid';
      return window === now || ahead ? 'current' : 'previous';
    },
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
    // RFC 9110 §4.2.4: an http(s) URI in a message carries no userinfo, and a recipient treats one as
    // an error. The origin below would drop it, and a proof naming `user:pw@` would match.
    if (url.username !== '' || url.password !== '') return undefined;
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
  /** The last instant the proof passes its `iat` window: it is not remembered (nor taken) after it. */
  validUntilMs: number;
  /** When the proof could no longer pass the `iat` window anyway, so the memory may forget it. */
  expiresAtMs: number;
  /** The proof's nonce is of the last window: the answer brings the current one (`DPoP-Nonce`). */
  renewNonce: boolean;
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

/** The largest RSA modulus a DPoP proof's key may have: 4096 bits. */
const maxProofRsaBytes = 512;

/** How many bytes an unpadded base64url text (a JWK member, checked canonical) decodes to. */
const base64urlBytes = (text: string) => Math.floor((text.length * 3) / 4);

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
  // Taken for `alg` alone, so the key verifies exactly that algorithm; a key that names the other of
  // EdDSA and Ed25519 (RFC 9864: one scheme, one curve) passes, as a configured key does.
  const checked = checkJwk(header.jwk, { algorithms: [alg as JwsAlgorithm], allowSymmetric: false });
  if (!checked.ok) return invalid;
  // The proof's key is the sender's own, not one the operator configured, and its signature is
  // checked before the access token is: an RSA key past 4096 bits is refused unverified. Its cost
  // grows with its size (on a 2-core box: 52 µs to verify at 2048 bits, 227 µs at 4096, 605 µs at
  // 8192, the largest the default maxHeaderLength lets through), so an unauthenticated sender would
  // otherwise buy twelve times the work of an ordinary proof per request. No client uses more.
  if (checked.key.jwk.kty === 'RSA' && base64urlBytes(checked.key.jwk.n as string) > maxProofRsaBytes) return invalid;
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
  // Last, once the proof is otherwise good: only a client that can make good proofs is handed a
  // nonce to retry with, and a proof refused for its nonce is not remembered (it may come again).
  let renewNonce = false;
  if (runtime.nonces !== undefined) {
    const freshness = runtime.nonces.check(claims.value.nonce, context.nowMs, context.clockToleranceMs);
    if (freshness === 'invalid') return { ok: false, code: 'dpop_nonce_required' };
    renewNonce = freshness === 'previous';
  }

  // The RFC 7638 thumbprint of the proof's key: the `cnf.jkt` a bound token must carry.
  const jkt = key.thumbprint;
  // The iat check above passes up to and including this instant.
  const validUntilMs = issuedMs + runtime.maxAgeMs + context.clockToleranceMs;
  // Remembered until the proof could no longer pass the iat window anyway: past `validUntilMs`, plus
  // the tolerance for a shared store whose clock runs behind. The memory forgets a key at its time, so
  // the time is 1 ms after the last instant it passes (with a tolerance of 0 they were the same).
  const expiresAtMs = validUntilMs + context.clockToleranceMs + 1;
  return { ok: true, jkt, replayKey: `${jkt}:${jti}`, validUntilMs, expiresAtMs, renewNonce };
}

/**
 * Records a verified proof in the replay memory (the `jti` memory A0 lacks). Returns the refusal:
 * `dpop_proof_invalid` for a proof whose `iat` window ended meanwhile, `dpop_proof_replayed` for a proof seen before, `dpop_replay_full` when the memory cannot take it,
 * `dpop_replay_share_full` when the proof's key already holds its share of the memory,
 * `dpop_replay_unavailable` when it throws or rejects; `undefined` when the proof is new and now
 * remembered. Call it only after the access token verified and matched the proof's key.
 *
 * @example
 * const refusal = await rememberProof(runtime, proof, Date.now());
 * if (refusal !== undefined) return refuse(refusal);
 */
export async function rememberProof(
  runtime: DpopRuntime,
  proof: VerifiedProof,
  nowMs: number,
): Promise<GuardErrorCode | undefined> {
  // The window was checked when the request came in; the token's verification (a JWKS fetch, up to its
  // timeout) may have outlasted it. Stored now, the key would already be due: a second request with the
  // same proof, checked in the window too, would clear it out and pass. Only a proof that still passes
  // is remembered, so its key outlives every request that could still present it.
  if (nowMs > proof.validUntilMs) return 'dpop_proof_invalid';
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
  if (answer === 'full') return 'dpop_replay_full';
  return answer === 'share-full' ? 'dpop_replay_share_full' : 'dpop_proof_replayed';
}

/**
 * The URL a proof's `htu` must match: the configured origin (or `http://` + Host) and the request path.
 * An absolute-form target counts by its path, and without `origin` its own origin replaces Host's.
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
  const target = typeof request.url === 'string' ? request.url : '/';
  // An absolute-form target (`POST https://api.example/orders HTTP/1.1`, as forward proxies send it)
  // is taken as RFC 9112 §3.2.2 asks: its authority names the server (in place of Host), and with a
  // configured origin only its path and query count, as they do for an origin-form target.
  if (absoluteForm.test(target) && URL.canParse(target)) {
    const url = new URL(target);
    if (url.protocol === 'http:' || url.protocol === 'https:') {
      return runtime.origin === undefined ? url.href : runtime.origin + url.pathname + url.search;
    }
  }
  // HTTP/2 names the host in `:authority` (RFC 9113 8.3.1), which Node lists with the headers.
  const host = request.headers.host ?? request.headers[':authority'];
  const origin = runtime.origin ?? `http://${typeof host === 'string' ? host : 'invalid.invalid'}`;
  return origin + target;
}

// A request target that starts with a scheme: every other form starts with `/` (or is `*`).
const absoluteForm = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//;
