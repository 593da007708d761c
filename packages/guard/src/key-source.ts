import { type JwsAlgorithm, verifiesAs } from './algorithms.js';
import type { GuardEvent } from './events.js';
import { importKeySet, type KeyPolicy, type KeySetRejection, type VerificationKey } from './key-import.js';
import { seconds } from './seconds.js';
import { parseStrictJson } from './strict-json.js';

/** What a key source answers for a token's `kid` and `alg`. */
export type KeyLookup =
  | { kind: 'found'; keys: readonly VerificationKey[] }
  | { kind: 'unknown-kid' }
  | { kind: 'alg-mismatch' }
  | { kind: 'unavailable' };

/** What reading a key set again did (see {@link KeySource.reload}). */
export type KeyReloadOutcome = 'fetched' | 'failed' | 'configured';

/** Where an issuer's verification keys come from. */
export interface KeySource {
  lookup(kid: string | undefined, alg: JwsAlgorithm): Promise<KeyLookup>;
  /**
   * Whether a result verified with the keys held now may answer now without a lookup:
   * true while a remote set is fresh, or stale while its refreshes fail (up to stale-if-error); false
   * past the set's lifetime after a successful fetch (a lookup fetches first), or with no trusted
   * keys. The verified-token cache asks it, so a cached result never outlives the keys behind it.
   */
  usable(): boolean;
  /**
   * Starts, in the background, the refresh a lookup now would start without waiting for it: ahead
   * of the end of a fresh set, or the next attempt of a failing endpoint once the cooldown allows.
   * The guard calls it on a verified-token cache hit, so a gateway whose traffic is all hits still
   * learns that a key was retired, and an outage never makes a hit wait for a fetch.
   */
  refreshIfDue(): void;
  /**
   * A signature did not verify with `tried`, the keys a lookup gave for this `kid` and `alg`: the
   * issuer may have put new material under the same `kid` (or rotated a set without kids). Fetches
   * again if the cooldown allows, as for an unknown `kid`, and answers the keys for them that were
   * not tried; `undefined` when there are none. Absent on sources that cannot change.
   */
  recheck?(
    kid: string | undefined,
    alg: JwsAlgorithm,
    tried: readonly VerificationKey[],
  ): Promise<readonly VerificationKey[] | undefined>;
  /**
   * Reads the set again now, an operator's answer to a compromised key withdrawn at the issuer, so
   * that tokens cached under a key it no longer holds are dropped at once (a cache hit reads nothing).
   * A remote set is fetched whatever its lifetime and the cooldown, with a request sent after this
   * call: `fetched` or `failed`. A set held in memory (a `jwks` function's) is read: `configured`.
   * Absent on a fixed set, which cannot change.
   */
  reload?(): Promise<KeyReloadOutcome>;
}

/**
 * The keys that may verify a token with this `kid` and `alg`. A key with a `kid` is only ever taken
 * for exactly that `kid`: no paths, no queries, no patterns (research case 17). With `kidlessMatchesAny`
 * (configured keys), a key without a `kid` is taken for any `kid` too, after the keys whose `kid`
 * matched: a PEM or a secret has no `kid` to give, while most identity providers, and the gateway,
 * name one in every token. A fetched JWKS keeps exact matching, so a new `kid` still leads to a refetch
 * instead of a try against a key-less entry.
 */
function match(
  keys: readonly VerificationKey[],
  kid: string | undefined,
  alg: JwsAlgorithm,
  kidlessMatchesAny = false,
): KeyLookup | undefined {
  if (kid !== undefined) {
    let named = false;
    const exact: VerificationKey[] = [];
    const kidless: VerificationKey[] = [];
    for (const key of keys) {
      const candidates = key.kid === kid ? exact : kidlessMatchesAny && key.kid === undefined ? kidless : undefined;
      if (candidates === undefined) continue;
      named = true;
      if (verifiesAs(key.alg, alg)) candidates.push(key);
    }
    if (!named) return undefined;
    // The keys that carry this kid come first: the likely signer is tried before the key-less ones.
    const usable = kidless.length === 0 ? exact : exact.concat(kidless);
    return usable.length === 0 ? { kind: 'alg-mismatch' } : { kind: 'found', keys: usable };
  }
  const usable = keys.filter((key) => verifiesAs(key.alg, alg));
  return usable.length === 0 ? undefined : { kind: 'found', keys: usable };
}

/**
 * A fixed set of keys (configured secret, PEM or JWK keys). A key configured without a `kid` verifies
 * tokens whatever `kid` they name; one with a `kid` only tokens that name it.
 *
 * @example
 * const source = staticKeySource(Promise.resolve([key]));
 */
export function staticKeySource(keys: Promise<readonly VerificationKey[]>): KeySource {
  return {
    async lookup(kid, alg) {
      const resolved = await keys;
      return match(resolved, kid, alg, true) ?? { kind: 'unknown-kid' };
    },
    usable: () => true,
    refreshIfDue: () => {},
  };
}

/**
 * Keys read from `read()` on every lookup: a set held in memory that changes, such as the internal
 * token issuer's `jwks()` in the same process, whose `rotate()` publishes a key before it signs and
 * withdraws a compromised one later. A copy taken once would refuse every token of the new key
 * (`key_unknown`) and keep verifying a withdrawn one for as long as the process lives. The set is
 * imported again only when its JSON changed, and then the tokens cached under the issuer are dropped
 * (`onKeysChanged`). A `read()` that throws, or a set that no longer imports, makes lookups
 * `unavailable` (`keys_unavailable`, the guard's fail-closed 401), never a 500.
 *
 * @example
 * const source = liveKeySource(() => issuer.jwks(), (set) => importLocal(set), () => cache.deleteIssuer(iss));
 */
export function liveKeySource(
  read: () => unknown,
  importSet: (set: unknown) => Promise<readonly VerificationKey[]>,
  onKeysChanged: () => void,
): KeySource {
  let lastText: string | undefined;
  let current: Promise<readonly VerificationKey[] | undefined> = Promise.resolve(undefined);
  const load = () => {
    let set: unknown;
    let text: string;
    try {
      set = read();
      text = JSON.stringify(set);
    } catch {
      return Promise.resolve(undefined);
    }
    if (text !== lastText) {
      const first = lastText === undefined;
      lastText = text;
      try {
        current = importSet(set).catch(() => undefined);
      } catch {
        current = Promise.resolve(undefined);
      }
      if (!first) onKeysChanged();
    }
    return current;
  };
  return {
    async lookup(kid, alg) {
      const resolved = await load();
      if (resolved === undefined) return { kind: 'unavailable' };
      return match(resolved, kid, alg, true) ?? { kind: 'unknown-kid' };
    },
    usable: () => true,
    refreshIfDue: () => {},
    async reload() {
      await load();
      return 'configured';
    },
  };
}

/**
 * Options of a remote JWKS. Durations are in seconds.
 *
 * @example
 * const jwksOptions: Omit<RemoteJwksOptions, 'uri'> = { cooldown: 30, staleIfError: 7200 };
 */
export interface RemoteJwksOptions {
  /** The JWKS URL. `https:` unless the host is loopback (tests, sidecars). */
  uri: string;
  /** Fetch timeout (default 5). */
  timeout?: number | undefined;
  /**
   * Minimum time between two fetches triggered by unknown kids, and after a failed fetch (default 30).
   * It never delays the refresh of a set whose lifetime ended after a successful fetch.
   */
  cooldown?: number | undefined;
  /** Cache lifetime when the response has no usable cache headers (default 600). */
  defaultTtl?: number | undefined;
  /** Lower bound on a cache lifetime taken from headers (default 30). */
  minTtl?: number | undefined;
  /** Upper bound on a cache lifetime taken from headers (default 86400). */
  maxTtl?: number | undefined;
  /** How long past expiry the last good keys stay usable while the endpoint fails (default 3600; 0 disables). */
  staleIfError?: number | undefined;
  /** How long a kid that a fresh fetch did not contain is answered from memory (default: the cooldown). */
  negativeTtl?: number | undefined;
  /** Largest accepted response body in bytes (default 262144). */
  maxBytes?: number | undefined;
  /** Largest number of remembered unknown kids (default 10000). */
  maxUnknownKids?: number | undefined;
  /** Extra request headers (for example an API key of a private JWKS). */
  headers?: Record<string, string> | undefined;
}

interface KeySetState {
  keys: readonly VerificationKey[];
  fetchedAt: number;
  expiresAt: number;
}

/** A remote JWKS source with its cache, exposed so tests and operators can inspect it. */
export interface RemoteKeySource extends KeySource {
  /** Fetches now (shares a fetch already in flight). Resolves to whether the fetch succeeded. */
  refresh(): Promise<boolean>;
}

// How long a JWKS response stays fresh from now, in seconds (RFC 9111 4.2): its freshness lifetime
// (max-age, else Expires minus Date) less the age it already had when it reached us. A CDN or proxy
// in front of the IdP answers from its own cache with `Age`; without subtracting it, a set cached
// there for most of its max-age would be kept here for a whole max-age more, so a rotation or a key
// revoked at the IdP would be seen up to twice as late as the IdP asked.
function parseCacheLifetime(headers: Headers, now: number): number | undefined {
  const cacheControl = headers.get('cache-control');
  if (cacheControl !== null) {
    const directives = cacheControl.toLowerCase();
    if (/(?:^|[,\s])(?:no-store|no-cache)(?:$|[,\s=])/.test(directives)) return 0;
    const maxAge = /(?:^|[,\s])max-age\s*=\s*("?)([^,\s"]*)\1/.exec(directives);
    if (maxAge !== null) {
      // RFC 9111 4.2.1: an invalid value (`max-age=-1`, `max-age=soon`) makes the directive invalid,
      // and the response is best taken as stale, not as carrying no lifetime (the long default).
      const value = maxAge[2] ?? '';
      return /^\d+$/.test(value) ? aged(Number(value), headers) : 0;
    }
  }
  const expires = headers.get('expires');
  if (expires === null) return undefined;
  const expiresAt = httpDate(expires);
  // RFC 9111 5.3: an Expires that is not a date (`0`, `-1`, as IIS and ASP.NET send) means "already
  // expired", not "no freshness information": the response is stale (minTtl), never the long default.
  if (Number.isNaN(expiresAt)) return 0;
  const date = headers.get('date');
  const datedAt = date === null ? Number.NaN : httpDate(date);
  // Without a Date, Expires is measured from now: that is already what is left, whatever its age.
  if (Number.isNaN(datedAt)) return Math.max(0, Math.floor((expiresAt - now) / 1000));
  return aged(Math.max(0, Math.floor((expiresAt - datedAt) / 1000)), headers);
}

// The three HTTP-date forms (RFC 9110 5.6.7), all in GMT: IMF-fixdate and RFC 850 say so, asctime
// (`Sun Nov  6 08:49:37 1994`) does not, and Date.parse alone reads it in the host's time zone (a
// JWKS fresh for five minutes was kept three and a half hours in St. John's). Other shapes are NaN.
const zonedHttpDate = /^[A-Z][a-z]{2,8}, \d{2}[ -][A-Z][a-z]{2}[ -]\d{2}(?:\d{2})? \d{2}:\d{2}:\d{2} GMT$/;
const asctimeDate = /^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/;

function httpDate(text: string): number {
  const trimmed = text.trim();
  if (zonedHttpDate.test(trimmed)) return Date.parse(trimmed);
  return asctimeDate.test(trimmed) ? Date.parse(`${trimmed} GMT`) : Number.NaN;
}

function aged(lifetime: number, headers: Headers): number {
  return Math.max(0, lifetime - ageOf(headers));
}

// The `Age` a cache on the way gave the response, in seconds; 0 when absent or not a plain
// non-negative integer (RFC 9111 5.1: an invalid Age is ignored). Several values (two caches that
// each appended one) take the first, as a recipient of a list-valued singleton field does.
function ageOf(headers: Headers): number {
  const field = headers.get('age');
  if (field === null) return 0;
  const first = field.split(',')[0]?.trim() ?? '';
  return /^\d+$/.test(first) ? Number(first) : 0;
}

class FetchFailure extends Error {
  constructor(
    readonly reason: 'timeout' | 'network' | 'status' | 'too-large' | 'invalid-json',
    readonly status?: number,
  ) {
    super(reason);
  }
}

async function readLimited(response: Response, maxBytes: number): Promise<string> {
  const declared = Number(response.headers.get('content-length'));
  if (Number.isFinite(declared) && declared > maxBytes) throw new FailureTooLarge();
  if (response.body === null) return '';
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      await reader.cancel();
      throw new FailureTooLarge();
    }
    chunks.push(value);
  }
  return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks));
}

class FailureTooLarge extends FetchFailure {
  constructor() {
    super('too-large');
  }
}

// The hosts a plain-http JWKS may be fetched from: traffic to them never leaves the machine.
// `localhost` by name (its one spelling: `*.localhost` and `localhost.` go to a resolver that may not
// keep them local), and by address all of 127.0.0.0/8 (RFC 1122 §3.2.1.3), `[::1]` and the
// IPv4-mapped 127.0.0.0/8 (`[::ffff:127.0.0.2]`, which the URL parser writes `[::ffff:7f00:2]`). The
// WHATWG parser has already rewritten every IPv4 spelling (`127.1`, `2130706433`, `0x7f.1`) to
// dotted decimal, so the address forms are compared as it writes them.
const loopbackIpv4 = /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/;
const loopbackMapped = /^\[::ffff:7f[0-9a-f]{2}:[0-9a-f]{1,4}\]$/;

function isLoopbackHost(hostname: string): boolean {
  return (
    hostname === 'localhost' || hostname === '[::1]' || loopbackIpv4.test(hostname) || loopbackMapped.test(hostname)
  );
}

/**
 * A remote JWKS with the behaviour none of the anchors combine (research section 10, items 1 and 2):
 * - cached for the server's `Cache-Control: max-age` / `Expires`, less the `Age` a cache on the way
 *   gave the response, clamped to [minTtl, maxTtl], and
 *   refreshed ahead in the background during the last tenth of that lifetime;
 * - an unknown `kid` triggers at most one refetch per cooldown, and every caller waiting meanwhile
 *   shares the one request in flight; kids a fresh fetch did not contain are remembered for
 *   `negativeTtl`, so a flood of random kids costs one fetch;
 * - a set whose lifetime ended is refreshed at once when the last fetch succeeded (the server's
 *   max-age decides, not the cooldown); after a failure the next attempt waits for the cooldown;
 * - when the cache has expired and the endpoint fails, the last good keys keep working for
 *   `staleIfError` seconds past expiry, then lookups fail closed (`unavailable`);
 * - fetches time out, never follow redirects, refuse bodies over `maxBytes`, duplicate-key JSON,
 *   private keys, a kid given to two keys it would verify with, symmetric keys and sets left with no
 *   usable key, and keep the previous set when they do (a refused body is a failed fetch: cooldown
 *   and stale-if-error apply);
 * - a key of the previous set that the new one no longer holds, the same material under the same
 *   `kid` and `alg`, is retired: `onKeysRetired` drops the tokens cached under it.
 *
 * @example
 * const source = remoteKeySource({ uri: 'https://id.example/jwks' }, { algorithms: ['RS256'], allowSymmetric: false }, {
 *   now: Date.now, clock: () => performance.now(), fetch: globalThis.fetch, emit: () => {},
 * });
 */
export function remoteKeySource(
  options: RemoteJwksOptions,
  policy: KeyPolicy,
  context: {
    /** Wall clock in epoch milliseconds: the `at` of events, and `Expires` headers. */
    now: () => number;
    /**
     * The clock every interval is measured on (lifetimes, cooldowns, remembered kids), in
     * milliseconds. A monotonic one in production: a wall clock set back an hour would keep a set
     * fresh and every on-demand fetch cooling down for that hour, so a rotated key would be refused.
     */
    clock: () => number;
    fetch: typeof globalThis.fetch;
    emit: (event: GuardEvent) => void;
    /** Called when a new set no longer holds a key of the previous one (a key was retired). */
    onKeysRetired?: () => void;
  },
): RemoteKeySource {
  // No parser error as the cause: its `input` is the whole value, and a signed URL's query is a
  // credential that a logger printing the cause would write out.
  // A URL object (JavaScript callers pass one; it worked before the parse check) is taken as its href.
  const given: unknown = options.uri;
  const text = given instanceof URL ? given.href : given;
  if (typeof text !== 'string' || !URL.canParse(text)) {
    throw new TypeError('jwksUri must be an absolute URL');
  }
  const url = new URL(text);
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && isLoopbackHost(url.hostname))) {
    throw new TypeError('jwksUri must use https: (http: is allowed for loopback hosts only)');
  }
  // fetch refuses a URL with credentials, so every fetch would fail as if the endpoint were down.
  if (url.username !== '' || url.password !== '') {
    throw new TypeError('jwksUri must not hold a user name or password: send them in jwksOptions.headers');
  }
  // Fetched as configured, less the fragment (never sent). Reported in events without the query: a
  // signed URL or an API key in a parameter is a credential, and events go to logs and metrics.
  url.hash = '';
  const fetchUri = url.href;
  const uri = `${url.origin}${url.pathname}`;
  // 0 would abort every fetch at once: no key would ever load.
  const timeoutMs = seconds(options.timeout ?? 5, 'jwks timeout', { min: 0.001 }) * 1000;
  const cooldownMs = seconds(options.cooldown ?? 30, 'jwks cooldown') * 1000;
  const defaultTtlMs = seconds(options.defaultTtl ?? 600, 'jwks defaultTtl') * 1000;
  const minTtlMs = seconds(options.minTtl ?? 30, 'jwks minTtl') * 1000;
  const maxTtlMs = seconds(options.maxTtl ?? 86_400, 'jwks maxTtl') * 1000;
  const staleMs = seconds(options.staleIfError ?? 3600, 'jwks staleIfError') * 1000;
  const negativeTtlMs = seconds(options.negativeTtl ?? cooldownMs / 1000, 'jwks negativeTtl') * 1000;
  // A count read from an unset environment variable is NaN, which would lift the bound it sets.
  const count = (value: number, name: string) => {
    if (!Number.isSafeInteger(value) || value < 1) throw new TypeError(`${name} must be a whole number, at least 1`);
    return value;
  };
  const maxBytes = count(options.maxBytes ?? 262_144, 'jwks maxBytes');
  const maxUnknownKids = count(options.maxUnknownKids ?? 10_000, 'jwks maxUnknownKids');
  const { now, clock, emit } = context;

  let state: KeySetState | undefined;
  let inFlight: Promise<boolean> | undefined;
  let lastAttemptAt = Number.NEGATIVE_INFINITY;
  let lastAttemptFailed = false;
  let failuresInARow = 0;
  const unknownKids = new Map<string, number>();

  async function fetchOnce(): Promise<boolean> {
    lastAttemptAt = clock();
    const startedClock = performance.now();
    const finish = (event: Omit<Extract<GuardEvent, { type: 'jwks-fetch' }>, 'type' | 'uri' | 'durationMs' | 'at'>) =>
      emit({ type: 'jwks-fetch', uri, durationMs: performance.now() - startedClock, at: now(), ...event });
    try {
      let response: Response;
      try {
        response = await context.fetch(fetchUri, {
          // A redirect is a failure: the configured URL is the trust anchor, not wherever it points.
          redirect: 'manual',
          signal: AbortSignal.timeout(timeoutMs),
          headers: { accept: 'application/jwk-set+json, application/json', ...options.headers },
        });
      } catch (cause) {
        const name = (cause as { name?: string })?.name;
        throw new FetchFailure(name === 'TimeoutError' || name === 'AbortError' ? 'timeout' : 'network');
      }
      if (response.status !== 200) {
        await response.body?.cancel().catch(() => {});
        throw new FetchFailure('status', response.status);
      }
      let text: string;
      try {
        text = await readLimited(response, maxBytes);
      } catch (cause) {
        if (cause instanceof FetchFailure) throw cause;
        const name = (cause as { name?: string })?.name;
        throw new FetchFailure(name === 'TimeoutError' || name === 'AbortError' ? 'timeout' : 'invalid-json');
      }
      const parsed = parseStrictJson(text, 8);
      if (!parsed.ok) throw new FetchFailure('invalid-json', response.status);
      const imported = await importKeySet(parsed.value, policy);
      const reject = (reason: KeySetRejection) => {
        emit({ type: 'jwks-rejected', uri, reason, at: now() });
        finish({ ok: false, status: 200, reason });
        return false;
      };
      if (!imported.ok) return reject(imported.reason);
      for (const drop of imported.dropped) {
        emit({ type: 'jwks-key-dropped', uri, kid: drop.kid, reason: drop.reason, at: now() });
      }
      // A set with no usable key is a failed fetch, not an answer. Taken in, it would replace the last
      // good keys with none: every token refused as `key_unknown`, stale-if-error never applying, and a
      // bad deploy of the identity provider (`{"keys": []}`) worse than the endpoint being down.
      if (imported.keys.length === 0) return reject('no-usable-keys');
      const lifetime = parseCacheLifetime(response.headers, now());
      const ttlMs = lifetime === undefined ? defaultTtlMs : Math.min(maxTtlMs, Math.max(minTtlMs, lifetime * 1000));
      const fetchedAt = clock();
      const previous = state?.keys ?? [];
      state = { keys: imported.keys, fetchedAt, expiresAt: fetchedAt + ttlMs };
      // Tokens cached under a retired key must be verified again (research section 10, item 10). A key
      // is the same only with the same material: new material under an old kid (or without a kid) is
      // a replacement, typically of a compromised key, and the old one's tokens must not outlive it.
      const kept = (old: VerificationKey) =>
        imported.keys.some((key) => key.thumbprint === old.thumbprint && key.kid === old.kid && key.alg === old.alg);
      if (!previous.every(kept)) context.onKeysRetired?.();
      // Kids remembered as unknown may be in the new set.
      unknownKids.clear();
      finish({ ok: true, status: 200, keys: imported.keys.length });
      return true;
    } catch (error) {
      if (error instanceof FetchFailure) {
        finish({ ok: false, reason: error.reason, ...(error.status === undefined ? {} : { status: error.status }) });
        return false;
      }
      finish({ ok: false, reason: 'network' });
      return false;
    }
  }

  function refresh(): Promise<boolean> {
    inFlight ??= fetchOnce()
      .then((ok) => {
        lastAttemptFailed = !ok;
        failuresInARow = ok ? 0 : failuresInARow + 1;
        return ok;
      })
      .finally(() => {
        inFlight = undefined;
      });
    return inFlight;
  }

  // Whether a refresh because the set's lifetime ends may start now. The cooldown is there to space out
  // fetches a client can provoke (unknown kids) and retries of a failing endpoint; after a success the
  // server's max-age decides, or a healthy endpoint with max-age under the cooldown would be served
  // stale (or fail closed) for the difference.
  // With no keys at all (an identity provider or a sidecar not up yet at startup), every request is
  // refused until a fetch succeeds: the next attempt comes after 1 s, then 2, 4, ... up to the
  // cooldown, not a whole cooldown after the first failure.
  function mayRefreshExpiring(at: number): boolean {
    if (!lastAttemptFailed) return true;
    const waitMs = state === undefined ? Math.min(cooldownMs, 1000 * 2 ** (failuresInARow - 1)) : cooldownMs;
    return at - lastAttemptAt >= waitMs;
  }

  // Remembers a kid that the set fetched at `fetchedAt` did not hold, for `negativeTtl` from that fetch.
  // Only a fetch says a kid is unknown: a kid first seen inside the cooldown (no fetch allowed) is
  // refused without being remembered, so a key published meanwhile is picked up on the first token
  // after the cooldown, not a `negativeTtl` later.
  function rememberUnknown(kid: string, fetchedAt: number): void {
    if (unknownKids.size >= maxUnknownKids) {
      const oldest = unknownKids.keys().next();
      if (!oldest.done) unknownKids.delete(oldest.value);
    }
    unknownKids.set(kid, fetchedAt + negativeTtlMs);
  }

  // Whether the held set may answer at `at`: fresh, or stale while refreshes fail, up to
  // stale-if-error past its expiry. Past it only a successful fetch brings keys back.
  const trusted = (at: number): boolean => state !== undefined && at < state.expiresAt + staleMs;

  // Refresh ahead: in the last tenth of the lifetime one request starts a fetch and does not wait for
  // it, so a busy gateway swaps key sets without any request paying for the fetch.
  function refreshAhead(fresh: KeySetState, at: number): void {
    const refreshAt = fresh.expiresAt - (fresh.expiresAt - fresh.fetchedAt) / 10;
    if (at >= refreshAt && inFlight === undefined && mayRefreshExpiring(at)) void refresh();
  }

  // What a cached result may rely on. A fresh set: yes. Past its lifetime while the endpoint fails:
  // yes, up to stale-if-error (the keys a lookup would fall back on). Past its lifetime after a
  // successful fetch: no, the cached result waits for the refresh with everyone else, since the
  // endpoint is healthy and may have retired the key.
  function usable(): boolean {
    if (state === undefined) return false;
    const at = clock();
    return at < state.expiresAt || (lastAttemptFailed && trusted(at));
  }

  function refreshIfDue(at = clock()): void {
    if (state === undefined) return;
    if (at < state.expiresAt) refreshAhead(state, at);
    else if (lastAttemptFailed && inFlight === undefined && mayRefreshExpiring(at)) void refresh();
  }

  async function currentKeys(): Promise<readonly VerificationKey[] | undefined> {
    const at = clock();
    if (state !== undefined && at < state.expiresAt) {
      refreshAhead(state, at);
      return state.keys;
    }
    // Expired while the endpoint fails: the last good keys answer at once (stale-if-error) and the
    // next attempt runs in the background once the cooldown allows. Waited for, it would hold every
    // request that misses the token cache for the fetch timeout, once per cooldown, for the whole
    // outage. Only the first refresh after a success is waited for: the endpoint was healthy and may
    // have retired a key.
    if (state !== undefined && lastAttemptFailed && trusted(at)) {
      refreshIfDue(at);
      emit({ type: 'jwks-stale', uri, ageMs: at - state.fetchedAt, at: now() });
      return state.keys;
    }
    // Expired or never fetched: refresh, unless a failed attempt is still cooling down.
    if (inFlight !== undefined || mayRefreshExpiring(at)) await refresh();
    const after = clock();
    if (state === undefined || !trusted(after)) return undefined;
    if (after >= state.expiresAt) emit({ type: 'jwks-stale', uri, ageMs: after - state.fetchedAt, at: now() });
    return state.keys;
  }

  // One fetch per cooldown for everything a client can provoke: unknown kids and failed signatures.
  const mayFetchOnDemand = () => inFlight !== undefined || clock() - lastAttemptAt >= cooldownMs;

  // A fetch already on its way may have left before the issuer withdrew the key, so its answer cannot
  // stand for "now": wait for it, then fetch again (shared with whoever started one after this call).
  async function reload(): Promise<KeyReloadOutcome> {
    const earlier = inFlight;
    if (earlier !== undefined) await earlier;
    return (await refresh()) ? 'fetched' : 'failed';
  }

  return {
    refresh,
    reload,
    usable,
    refreshIfDue,
    async recheck(kid, alg, tried) {
      if (!mayFetchOnDemand()) return undefined;
      await refresh();
      const again = state === undefined ? undefined : match(state.keys, kid, alg);
      if (again?.kind !== 'found') return undefined;
      const untried = again.keys.filter((key) => !tried.some((old) => old.thumbprint === key.thumbprint));
      return untried.length === 0 ? undefined : untried;
    },
    async lookup(kid, alg) {
      const keys = await currentKeys();
      if (keys === undefined) return { kind: 'unavailable' };
      const found = match(keys, kid, alg);
      if (found !== undefined) return found;
      const memoryKey = kid ?? '';
      const rememberedUntil = unknownKids.get(memoryKey);
      if (rememberedUntil !== undefined && clock() < rememberedUntil) return { kind: 'unknown-kid' };
      if (mayFetchOnDemand()) {
        // One fetch per cooldown, shared by every caller that arrives while it runs.
        const fetched = await refresh();
        const again = state === undefined ? undefined : match(state.keys, kid, alg);
        if (again !== undefined) return again;
        // A failed fetch says nothing about the kid; the cooldown alone spaces out the next attempt.
        if (fetched && state !== undefined) rememberUnknown(memoryKey, state.fetchedAt);
      }
      return { kind: 'unknown-kid' };
    },
  };
}
