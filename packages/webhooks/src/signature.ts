import { assertKnownOptions, type Duration, toMilliseconds } from '@idem/core';
import { toBodyBytes, type WebhookBody } from './body.js';
import { WebhookError } from './errors.js';
import { type HeaderInput, isValidWebhookId, parseWebhookHeaders, type WebhookHeaders } from './headers.js';
import { type ParsedSecret, parseSecrets, type SignatureVersion, type WebhookSecret } from './secrets.js';

/** The bytes Standard Webhooks signs: `id.timestamp.` followed by the exact body bytes. */
function signedContent(id: string, timestamp: string, body: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${id}.${timestamp}.`, 'utf8'), body]);
}

/** Options of {@link createSigner}. */
export interface SignerOptions {
  /** One secret, or several to sign with each (every receiver accepts if any one matches). */
  secret: WebhookSecret | readonly WebhookSecret[];
}

/** What {@link Signer.sign} signs. */
export interface SignInput {
  /** The event id, the same on every attempt. */
  id: string;
  /** The exact bytes that will be sent. */
  body: WebhookBody;
  /** When this attempt is made: a `Date`, or Unix seconds. */
  timestamp: Date | number;
}

/** Signs deliveries with one or more parsed secrets. */
export interface Signer {
  sign(input: SignInput): WebhookHeaders;
}

function unixSeconds(timestamp: Date | number): number {
  const seconds = timestamp instanceof Date ? Math.floor(timestamp.getTime() / 1000) : timestamp;
  if (!Number.isSafeInteger(seconds) || seconds < 0)
    throw new TypeError('timestamp must be a Date or non-negative Unix seconds');
  return seconds;
}

/**
 * Creates a signer. Secrets are parsed once, here; a `whpk_` public key cannot sign and throws.
 * With several secrets the header carries one entry per secret (`v1,... v1a,...`), which is how a
 * sender rotates keys or offers both schemes during a migration.
 *
 * @example
 * const signer = createSigner({ secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' });
 * const headers = signer.sign({ id: 'msg_1', body: '{"ok":true}', timestamp: new Date() });
 * await fetch(url, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body });
 */
export function createSigner(options: SignerOptions): Signer {
  if (!options || typeof options !== 'object') throw new TypeError('createSigner needs an options object');
  assertKnownOptions(options, new Set(['secret']), 'createSigner');
  const signers = parseSecrets(options.secret).map((key) => {
    if (!key.signer)
      throw new WebhookError('secret_invalid', 'A whpk_ public key can verify but not sign; use the whsk_ key.');
    return key.signer;
  });
  return {
    sign({ id, body, timestamp }) {
      if (!isValidWebhookId(id)) {
        throw new TypeError('id must be 1 to 256 printable ASCII characters without spaces or dots');
      }
      const seconds = String(unixSeconds(timestamp));
      const content = signedContent(id, seconds, toBodyBytes(body));
      const signature = signers.map((signer) => `${signer.version},${signer.sign(content)}`).join(' ');
      return { 'webhook-id': id, 'webhook-timestamp': seconds, 'webhook-signature': signature };
    },
  };
}

/**
 * Signs one delivery. Prefer {@link createSigner} when signing many: it parses the secrets once.
 *
 * @example
 * const headers = sign({ secret: 'whsec_...', id: 'msg_1', body: rawBytes, timestamp: new Date() });
 */
export function sign(input: SignInput & SignerOptions): WebhookHeaders {
  return createSigner({ secret: input.secret }).sign(input);
}

/** How far a timestamp may lie from the receiver's clock: one bound for both sides, or each side. */
export type Tolerance = Duration | { past: Duration; future: Duration };

/** Options of {@link createVerifier}. */
export interface VerifierOptions {
  /**
   * The trusted secrets. Several are accepted during rotation; a delivery passes if any one of its
   * signatures matches any secret of the same version. Never take a key from the request itself.
   */
  secret: WebhookSecret | readonly WebhookSecret[];
  /**
   * Allowed clock distance, in both directions. Default `'5m'`, as every Standard Webhooks library.
   * At least `'1s'` on each side (timestamps are whole seconds); there is no "off".
   */
  tolerance?: Tolerance | undefined;
  /** The receiver's clock, epoch milliseconds. Inject in tests. Default `Date.now`. */
  now?: (() => number) | undefined;
}

/** What {@link Verifier.verify} checks. */
export interface VerifyInput {
  headers: HeaderInput;
  /** The raw body bytes as received. A parsed object throws `raw_body_required`. */
  body: unknown;
}

/** A verified delivery. */
export interface VerifiedWebhook {
  id: string;
  /** The attempt's timestamp, Unix seconds. */
  timestamp: number;
  /** The version of the signature that matched. */
  version: SignatureVersion;
  /** The exact bytes that were verified. */
  body: Buffer;
}

/** The result of {@link Verifier.verify}: a value, never an exception, for a bad delivery. */
export type VerifyResult = { ok: true; webhook: VerifiedWebhook } | { ok: false; error: WebhookError };

/** Verifies deliveries against parsed secrets. */
export interface Verifier {
  /**
   * Checks headers, timestamp tolerance and signature, in that order, so a stale or future delivery
   * is refused before any signature work or database access. Throws only for a non-raw body.
   */
  verify(input: VerifyInput): VerifyResult;
  /** The resolved tolerances, in milliseconds. */
  readonly tolerance: Readonly<{ pastMs: number; futureMs: number }>;
}

/**
 * Creates a Standard Webhooks verifier for `v1` (HMAC-SHA256) and `v1a` (Ed25519) signatures over
 * the exact body bytes, with strict header parsing and a timestamp window bounded on both sides.
 * Unknown signature versions in the header are skipped; several entries allow key rotation.
 *
 * @example
 * const verifier = createVerifier({ secret: process.env.WEBHOOK_SECRET!, tolerance: '5m' });
 * const result = verifier.verify({ headers: req.headers, body: rawBody });
 * if (!result.ok) return res.status(result.error.status).json(result.error.toProblem());
 * handle(JSON.parse(result.webhook.body.toString('utf8')));
 */
export function createVerifier(options: VerifierOptions): Verifier {
  if (!options || typeof options !== 'object') throw new TypeError('createVerifier needs an options object');
  assertKnownOptions(options, new Set(['secret', 'tolerance', 'now']), 'createVerifier');
  const keys: ParsedSecret[] = parseSecrets(options.secret);
  const tolerance = options.tolerance ?? '5m';
  const pastMs =
    typeof tolerance === 'object'
      ? toMilliseconds(tolerance.past, 'tolerance.past')
      : toMilliseconds(tolerance, 'tolerance');
  const futureMs =
    typeof tolerance === 'object'
      ? toMilliseconds(tolerance.future, 'tolerance.future')
      : toMilliseconds(tolerance, 'tolerance');
  // webhook-timestamp is whole seconds, so a delivery signed this very second is already up to 999 ms
  // old: a window under a second refuses nearly every delivery. Zero is not read as "off" (as
  // Stripe's libraries do): without a window a captured delivery stays valid forever, and once its
  // id has left the receiver's retention it would be applied again.
  for (const [side, ms] of [
    ['past', pastMs],
    ['future', futureMs],
  ] as const) {
    if (ms < 1000) {
      throw new TypeError(
        `tolerance${typeof tolerance === 'object' ? `.${side}` : ''} must be at least 1s: webhook timestamps are whole seconds`,
      );
    }
  }
  const now = options.now ?? Date.now;
  const versions = new Set<string>(keys.map((key) => key.version));

  return {
    tolerance: Object.freeze({ pastMs, futureMs }),
    verify({ headers, body }) {
      // The body check comes first: a parsed body is a deployment bug that must surface as such,
      // never disguised as a signature mismatch.
      const bytes = toBodyBytes(body);
      const parsed = parseWebhookHeaders(headers);
      if (!parsed.ok) return parsed;
      const { id, timestamp, timestampText, signatures } = parsed.value;
      // The stamp is a whole second: the delivery was signed somewhere in [timestamp, timestamp + 1 s).
      // Too old only when all of that second lies past the window (the Standard Webhooks libraries'
      // whole-second comparison); counting its lost fraction against the sender would refuse, in
      // all but its first millisecond, a delivery that may still be inside the tolerance. The future
      // side counts from the second's start, the earliest instant it can stand for.
      const age = now() - timestamp * 1000;
      if (age - 1000 >= pastMs) {
        return {
          ok: false,
          error: new WebhookError('timestamp_too_old', 'The webhook timestamp is older than the allowed tolerance.', {
            details: { ageSeconds: Math.floor(age / 1000) },
          }),
        };
      }
      if (-age > futureMs) {
        return {
          ok: false,
          error: new WebhookError(
            'timestamp_too_new',
            'The webhook timestamp is further in the future than the allowed tolerance.',
            {
              details: { aheadSeconds: Math.floor(-age / 1000) },
            },
          ),
        };
      }
      const usable = signatures.filter((entry) => versions.has(entry.version));
      if (usable.length === 0) {
        return {
          ok: false,
          error: new WebhookError(
            'signature_unsupported',
            'The webhook carries no signature of a version this receiver has a key for.',
            {
              details: { versions: [...new Set(signatures.map((entry) => entry.version))].join(',') },
            },
          ),
        };
      }
      const content = signedContent(id, timestampText, bytes);
      const checks = keys.map((key) => ({ version: key.version, check: key.checkerFor(content) }));
      for (const entry of usable) {
        for (const key of checks) {
          if (key.version === entry.version && key.check(entry.signature)) {
            return { ok: true, webhook: { id, timestamp, version: key.version, body: bytes } };
          }
        }
      }
      return {
        ok: false,
        error: new WebhookError(
          'signature_mismatch',
          'No webhook signature matches. If the sender is right, the body bytes were changed on the way (re-serialised, re-encoded, trimmed or base64-wrapped).',
          { details: { bodyBytes: bytes.length, signatures: usable.length } },
        ),
      };
    },
  };
}

/**
 * Verifies one delivery. Prefer {@link createVerifier} for a server: it parses the secrets once.
 *
 * @example
 * const result = verify({ secret: 'whsec_...', headers: req.headers, body: rawBody });
 */
export function verify(input: VerifyInput & VerifierOptions): VerifyResult {
  const { headers, body, ...options } = input;
  return createVerifier(options).verify({ headers, body });
}
