import type { IncomingHttpHeaders } from 'node:http';
import { engineOptionNames, type IdempotencyOptions } from './engine-options.js';
import { checkExcludes, type FingerprintOptions, fingerprintRequest, type RequestParts } from './fingerprint.js';
import { assertKnownOptions, type ListsEvery } from './option-names.js';
import type { StoreUnavailablePolicy } from './store-unavailable.js';

/**
 * Options shared by the Express, Fastify and Koa adapters: the engine's options plus the HTTP ones.
 * `Req` is the framework's request object (`req`, `request` or `ctx`), as seen by `scope`.
 */
export interface HttpIdempotencyOptions<Req> extends IdempotencyOptions {
  /** Answer 400 when a covered request has no key. Default true. With false, such requests pass through untouched. */
  required?: boolean | undefined;
  /** Methods that are covered. Default `['POST', 'PATCH']`: PUT and DELETE are idempotent by definition (spec part 1). */
  methods?: readonly string[] | undefined;
  /**
   * Who is calling, as a string; requests with different scopes never share a record. Default: the
   * principal the guard attached (`sub` and `iss` of `req.auth`, `request.auth` or `ctx.state.auth`).
   * Return `undefined` (or `''`) when there is no caller: the request is refused with 500 `scope_missing`.
   */
  scope?: ((request: Req) => string | undefined) | undefined;
  /** Mint a key for a covered request that has none and return it in `Idempotency-Key` (spec part 3, rule 3). Default false. */
  mintKeys?: boolean | undefined;
  /** Largest request body hashed, in bytes; larger bodies get 413 before any hashing or claim. Default 1 MiB. */
  maxBodyBytes?: number | undefined;
  /** Largest response body stored, in bytes; larger responses are served but not stored. Default 1 MiB. */
  maxResponseBytes?: number | undefined;
  /** Response headers replayed on top of the built-in allowlist (lower or mixed case). */
  replayHeaders?: readonly string[] | undefined;
  /** Run the handler inside the store's transaction and hold the response until it commits. Default false. */
  transactional?: boolean | undefined;
  /** Accept only RFC 9651 sf-string keys (`"abc"`). Default false. */
  strictKeys?: boolean | undefined;
  /**
   * What the request's identity leaves out or takes in besides method, route, path, query, media
   * type and body: `{ exclude: ['/sentAt'] }` (JSON Pointers of volatile body fields), `{ headers:
   * ['api-version'] }` (request headers whose values are part of it). While changing either on a live
   * service, list the settings it had in `previous`.
   */
  fingerprint?: HttpFingerprintOptions | undefined;
  /**
   * Tell the client how long its key is kept: a first execution whose outcome the policy stores gets
   * `Idempotency-Expires` (an HTTP-date, as `Expires` has it) when its head goes out, and its replays
   * carry the same value. The date is the server's clock plus the outcome's retention, rounded down
   * to the second; the store counts the retention from the completion, by its own clock, so a retry
   * with the key until then replays (barring clock skew between the two). Default false.
   */
  advertiseExpiry?: boolean | undefined;
  /**
   * What a covered request gets when the store cannot be reached to claim its key (a
   * `StoreUnavailableError` such as a refused connection, or `storeTimeout`; any other error fails
   * closed). `'fail-closed'` (default): 503 `store_unavailable` with `Retry-After`,
   * and the handler never runs. `'fail-open'`: the handler runs unprotected, once for this request;
   * its response goes out as written, with the client's `Idempotency-Key` echoed (a minted key is
   * not handed out: it was never stored), and nothing is stored or replayed, so a retry runs it again
   * (the first one after the store is back too). The handler gets no idempotency context. The
   * claim's `store-error` event says `unprotected: true`. A key in progress (409), another request
   * under the key (422) and a failure once the key is claimed answer as ever. Not with
   * `transactional: true` (a `TypeError`): the handler's writes need the store's transaction.
   */
  storeUnavailable?: StoreUnavailablePolicy | undefined;
}

/** What the HTTP layer's fingerprint covers: {@link FingerprintOptions} and request headers. */
export interface HttpFingerprintSettings extends FingerprintOptions {
  /**
   * Request headers whose values are part of the request's identity, by name (any case): an API
   * version (`'api-version'`, `'stripe-version'`), a tenant or account switch. The same key sent
   * with another value is another request (422); an absent header and an empty one are alike.
   * Headers that change from one attempt to the next are refused at construction (a `TypeError`):
   * credentials (`authorization`, `cookie`, `dpop`), the key itself, per-attempt ids and trace
   * context, dates, signatures over a fresh timestamp (`webhook-signature`, `stripe-signature`,
   * `signature`), retry counters (`x-envoy-attempt-count`), and framing (`content-length`,
   * `transfer-encoding`), since every honest retry would be refused 422.
   */
  headers?: readonly string[] | undefined;
}

/** The fingerprint options of the HTTP layer: what it covers, and what it covered before. */
export interface HttpFingerprintOptions extends HttpFingerprintSettings {
  /**
   * The settings (`exclude`, `headers`) the service had before a change of them, for as long as
   * records made under them may be retried: one retention after the change, then remove them.
   * Changing `exclude` or `headers` changes every request's fingerprint, so without them every retry
   * of a request stored before the change is refused 422 `fingerprint_mismatch` for the whole
   * retention, though it was sent byte for byte the same. When a record's fingerprint is not the
   * request's, the request is fingerprinted again under each of these (only then: a match costs
   * nothing more), and one that gives the record's is the same request: replayed, answered 409
   * while in progress, or taken over when abandoned (the record keeps its fingerprint, so instances
   * still on the old settings match it too). Each is checked at construction as the current
   * settings are. The request headers any of them names are read as `headers` are.
   *
   * @example
   * // `/sentAt` is excluded now; before, the service had no fingerprint option.
   * const fingerprint: HttpFingerprintOptions = { exclude: ['/sentAt'], previous: [{}] };
   */
  previous?: readonly HttpFingerprintSettings[] | undefined;
}

// Every name HttpIdempotencyOptions adds to the engine's; the type check keeps the list complete.
const httpOptionNames = [
  'required',
  'methods',
  'scope',
  'mintKeys',
  'maxBodyBytes',
  'maxResponseBytes',
  'replayHeaders',
  'transactional',
  'strictKeys',
  'fingerprint',
  'advertiseExpiry',
  'storeUnavailable',
] as const satisfies readonly (keyof HttpIdempotencyOptions<unknown>)[];
const everyHttpOptionNamed: ListsEvery<
  HttpIdempotencyOptions<unknown>,
  [...typeof engineOptionNames, ...typeof httpOptionNames]
> = true;
void everyHttpOptionNamed;
export const knownHttpOptions: ReadonlySet<string> = new Set([...engineOptionNames, ...httpOptionNames]);
const knownFingerprintSettings: ReadonlySet<string> = new Set<keyof HttpFingerprintSettings>(['exclude', 'headers']);
export const knownFingerprintOptions: ReadonlySet<string> = new Set<keyof HttpFingerprintOptions>([
  'exclude',
  'headers',
  'previous',
]);

/**
 * Headers a replay carries when the handler set them; the user adds more with `replayHeaders`. The
 * last two are ones a status requires (RFC 9110): `Content-Range` in a 206, `Allow` in a 405. They
 * describe the stored answer, not the request.
 */
export const defaultReplayHeaders = [
  'content-type',
  'content-encoding',
  'content-language',
  // The file name of a download (RFC 6266): it describes the stored body, as the type does.
  'content-disposition',
  'location',
  'content-location',
  'etag',
  'last-modified',
  'link',
  'vary',
  'content-range',
  'allow',
] as const;

// Per-request or per-client headers: replaying them would hand one response's cookie, date, quota
// or trace id to another request; and fields about one connection (`upgrade`, `te`, ...), which an
// HTTP/2 retry could not even be sent. They are refused even when listed in `replayHeaders`. Rate
// limits in both spellings (`X-RateLimit-*`, and `X-Rate-Limit-*` as Twitter and many APIs write
// it); request ids and trace context as the usual tracers and platforms answer them (W3C's
// `traceresponse`, AWS, Google Cloud, Zipkin's B3, Jaeger, Datadog, Sentry, Cloudflare's `CF-Ray`).
export const neverReplayed =
  /^(set-cookie|date|age|expires|content-length|transfer-encoding|connection|keep-alive|proxy-connection|upgrade|te|http2-settings|idempotency-key|idempotent-replayed|cache-control|x-request-id|request-id|x-correlation-id|x-amzn-requestid|x-amz-request-id|traceparent|tracestate|traceresponse|baggage|x-amzn-trace-id|x-cloud-trace-context|x-b3-.*|b3|uber-trace-id|x-datadog-.*|sentry-trace|cf-ray|x-ratelimit-.*|x-rate-limit-.*|ratelimit.*|retry-after)$/;

// Request headers that differ between attempts of one operation: in the identity, every retry would
// be another request (422). Credentials rotate; ids, trace context and timing marks are per attempt;
// a webhook sender signs a fresh timestamp on every attempt (Standard Webhooks, Svix, Stripe, and
// @idem/webhooks' own sender), as HTTP message signatures (RFC 9421) and AWS SigV4 date theirs; a
// proxy counts its retries (Envoy); framing is per message.
const perAttempt =
  /^(authorization|proxy-authorization|cookie|dpop|idempotency-key|date|content-length|transfer-encoding|connection|keep-alive|te|expect|upgrade|x-request-id|request-id|x-correlation-id|traceparent|tracestate|baggage|x-amzn-trace-id|x-b3-.*|b3|x-cloud-trace-context|sentry-trace|uber-trace-id|x-datadog-.*|x-ot-span-context|grpc-trace-bin|cf-ray|x-request-start|x-queue-start|webhook-timestamp|webhook-signature|svix-timestamp|svix-signature|stripe-signature|signature|signature-input|x-amz-date|x-amz-security-token|x-envoy-attempt-count|x-envoy-expected-rq-timeout-ms|x-forwarded-.*|forwarded|x-real-ip|cf-connecting-ip|true-client-ip)$/;

// Header names as RFC 9110 has them (a token), checked once so that a typo cannot silently match nothing.
export const headerName = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
// A method is a token (RFC 9110 §9.1), of any case here: it is compared upper-cased.
export const methodToken = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** The names of `fingerprint.headers`, lower case, checked: see {@link HttpFingerprintSettings.headers}. */
export function checkIdentityHeaders(names: unknown, option = 'fingerprint.headers'): readonly string[] | undefined {
  if (names === undefined) return undefined;
  if (!Array.isArray(names)) throw new TypeError(`${option} must be an array of header names`);
  const lower = new Set<string>();
  for (const name of names) {
    const header = typeof name === 'string' ? name.toLowerCase() : '';
    if (!headerName.test(header)) throw new TypeError(`${option} holds ${JSON.stringify(name)}, no header name`);
    if (perAttempt.test(header)) {
      throw new TypeError(
        `${option} must not include ${header}: it changes from one attempt to the next, so every retry would be refused 422`,
      );
    }
    lower.add(header);
  }
  return lower.size === 0 ? undefined : [...lower];
}

/**
 * The request's fingerprint under each of `fingerprint.previous`: what the engine compares a
 * record's with when the current one does not match it.
 */
export function previousFingerprints(
  parts: RequestParts,
  previous: readonly PreviousSettings[],
  headers: IncomingHttpHeaders | undefined,
): string[] {
  return previous.map((settings) =>
    fingerprintRequest(
      { ...parts, headers: settings.headers === undefined ? undefined : identityOf(settings.headers, headers) },
      settings,
    ),
  );
}

/** One of `fingerprint.previous`, checked: its exclude as given, its header names as `identityOf` reads them. */
interface PreviousSettings {
  exclude: readonly string[] | undefined;
  headers: readonly string[] | undefined;
}

/** `fingerprint.previous`, checked as the current settings are; undefined when it lists none. */
export function checkPrevious(previous: unknown): readonly PreviousSettings[] | undefined {
  if (previous === undefined) return undefined;
  if (!Array.isArray(previous)) {
    throw new TypeError(
      'fingerprint.previous must be an array of earlier fingerprint settings, each { exclude?, headers? }',
    );
  }
  const checked = previous.map((settings: unknown, i): PreviousSettings => {
    const name = `fingerprint.previous[${i}]`;
    if (settings === null || typeof settings !== 'object' || Array.isArray(settings)) {
      throw new TypeError(`${name} must be { exclude?, headers? }`);
    }
    // Its own check: a nested `previous` is no setting, and a misspelt `exlude` would exclude nothing.
    assertKnownOptions(settings, knownFingerprintSettings, name);
    const { exclude, headers } = settings as HttpFingerprintSettings;
    return {
      exclude: checkExcludes(exclude, `${name}.exclude`),
      headers: checkIdentityHeaders(headers, `${name}.headers`),
    };
  });
  return checked.length === 0 ? undefined : checked;
}

// The values of the identity headers, by name: a repeated field as Node joins it (`, `).
export function identityOf(
  names: readonly string[],
  headers: IncomingHttpHeaders | undefined,
): Record<string, string | undefined> {
  if (headers === undefined) {
    throw new TypeError('fingerprint.headers is set, but the adapter passed no request headers to begin()');
  }
  const values: Record<string, string | undefined> = {};
  for (const name of names) {
    const value = headers[name];
    values[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return values;
}

export const MIB = 1_048_576;

/** The header of `advertiseExpiry`. */
export const expiresHeader = 'idempotency-expires';

export function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`${name} must be a positive integer`);
  return value;
}
