import { WebhookError } from './errors.js';
import type { SignatureVersion } from './secrets.js';

/** The three Standard Webhooks headers, as a sender sets them. */
export type WebhookHeaders = {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
};

type HeaderValue = string | readonly string[] | number | undefined;

/**
 * Request headers in any common shape: a fetch `Headers`, Node's (or a framework's) plain object, or
 * a `Map` of names to values (read as the plain object is: names in any case).
 */
export type HeaderInput = Headers | Readonly<Record<string, HeaderValue>> | ReadonlyMap<string, HeaderValue>;

/** The parsed, validated Standard Webhooks headers. */
export interface ParsedWebhookHeaders {
  id: string;
  /** Unix seconds. */
  timestamp: number;
  /** The raw timestamp text, exactly as signed. */
  timestampText: string;
  signatures: { version: string; signature: Buffer }[];
}

// Printable ASCII without space and without '.': the signed content is `id.timestamp.body`, and an id
// holding a dot could be re-split against a different timestamp and body (Standard Webhooks asks for no dots).
const ID = /^[\x21-\x2d\x2f-\x7e]{1,256}$/;
// Digits only: no sign, no spaces, no fraction, no exponent. parseInt-style leniency lets `123abc` pass.
const TIMESTAMP = /^[0-9]{1,15}$/;
const ENTRY = /^([a-z0-9]{1,16}),([A-Za-z0-9+/]+={0,2})$/;
// The versions this package can check. Their entries must be well formed; an entry of any other
// version is skipped whatever it holds (Standard Webhooks: a receiver tries the versions it knows), so
// a scheme added later, in a form we cannot foresee, never makes a valid entry beside it unreadable.
const KNOWN_VERSIONS: ReadonlySet<string> = new Set(['v1', 'v1a'] satisfies SignatureVersion[]);
// Each entry may cost an Ed25519 verification; a bounded list keeps a hostile header cheap.
const MAX_ENTRIES = 32;

/**
 * Reads one header by lower-case name. Two field lines for one name count as malformed: a proxy
 * or an attacker appending a second value must not get a say in which one is checked. In a plain
 * object or a Map that is an array, or one name under two spellings (`webhook-signature` and
 * `Webhook-Signature`: a hand-built map, or a gateway's that keeps names as the client sent them).
 */
function readHeader(headers: HeaderInput, name: string): string | undefined | false {
  // A Map has get() and has() too, but its keys are exact: taken for a Headers, it missed a
  // `Webhook-Id` spelt in capitals. Its entries are read as a plain object's are.
  if (
    !(headers instanceof Map) &&
    typeof (headers as Headers).get === 'function' &&
    typeof (headers as Headers).has === 'function'
  ) {
    return (headers as Headers).get(name) ?? undefined;
  }
  const entries: Iterable<[unknown, HeaderValue]> =
    headers instanceof Map ? headers : Object.entries(headers as Readonly<Record<string, HeaderValue>>);
  let value: HeaderValue;
  let spellings = 0;
  for (const [key, entry] of entries) {
    if (typeof key !== 'string' || key.toLowerCase() !== name || entry === undefined) continue;
    value = entry;
    spellings++;
  }
  if (spellings > 1) return false;
  if (value === undefined) return undefined;
  if (Array.isArray(value)) return value.length === 1 && typeof value[0] === 'string' ? value[0] : false;
  return String(value);
}

const malformed = (which: string) =>
  new WebhookError('header_invalid', `The ${which} header is malformed.`, { details: { header: which } });

/**
 * Parses and validates the three Standard Webhooks headers, strictly: the id is 1 to 256 printable
 * ASCII characters without spaces or dots, the timestamp is digits only, and the signature header is a
 * space-separated list of at most 32 entries, where each `v1` or `v1a` entry is `version,base64`.
 * Entries of other versions are skipped whatever they hold. Returns the typed error otherwise.
 *
 * @example
 * const parsed = parseWebhookHeaders(req.headers);
 * if (!parsed.ok) return reply(parsed.error.status, parsed.error.toProblem());
 */
export function parseWebhookHeaders(
  headers: HeaderInput,
): { ok: true; value: ParsedWebhookHeaders } | { ok: false; error: WebhookError } {
  if (!headers || typeof headers !== 'object')
    throw new TypeError('headers must be a Headers object, a plain object or a Map');
  const id = readHeader(headers, 'webhook-id');
  const timestampText = readHeader(headers, 'webhook-timestamp');
  const signature = readHeader(headers, 'webhook-signature');
  if (id === undefined || timestampText === undefined || signature === undefined) {
    const missing = [
      id === undefined ? 'webhook-id' : undefined,
      timestampText === undefined ? 'webhook-timestamp' : undefined,
      signature === undefined ? 'webhook-signature' : undefined,
    ].filter((name): name is string => name !== undefined);
    return {
      ok: false,
      error: new WebhookError('headers_missing', `Missing webhook headers: ${missing.join(', ')}.`, {
        details: { missing: missing.join(',') },
      }),
    };
  }
  if (id === false || !ID.test(id)) return { ok: false, error: malformed('webhook-id') };
  if (timestampText === false || !TIMESTAMP.test(timestampText))
    return { ok: false, error: malformed('webhook-timestamp') };
  // Node (req.headers) and fetch (Headers.get) join two field lines of one name with ", ", which no
  // single signature header holds (entries are separated by spaces, a version from its signature by
  // a comma): without this, a line of an unknown version followed by one that verifies would pass.
  if (signature === false || signature.includes(', ')) return { ok: false, error: malformed('webhook-signature') };
  const entries = signature.trim().split(/ +/);
  if (entries.length > MAX_ENTRIES || entries[0] === '') return { ok: false, error: malformed('webhook-signature') };
  const signatures: ParsedWebhookHeaders['signatures'] = [];
  for (const entry of entries) {
    const match = ENTRY.exec(entry);
    if (!match) {
      const comma = entry.indexOf(',');
      if (KNOWN_VERSIONS.has(comma === -1 ? entry : entry.slice(0, comma)))
        return { ok: false, error: malformed('webhook-signature') };
      continue;
    }
    const [, version, text] = match as unknown as [string, string, string];
    const signature = Buffer.from(text, 'base64');
    // One spelling per signature: Buffer.from also decodes a base64 without its padding, or with the
    // unused bits of its last character set, to the same bytes, a second spelling of one signature
    // (that a receiver logging or deduplicating entries would count as another). The Standard
    // Webhooks libraries compare the text, and refuse those too.
    if (KNOWN_VERSIONS.has(version) && signature.toString('base64') !== text)
      return { ok: false, error: malformed('webhook-signature') };
    signatures.push({ version, signature });
  }
  return { ok: true, value: { id, timestamp: Number(timestampText), timestampText, signatures } };
}

/**
 * True when `id` may be used as a `webhook-id` (see {@link parseWebhookHeaders} for the rule).
 *
 * @example
 * isValidWebhookId('evt_123'); // true
 * isValidWebhookId('a.b');     // false
 */
export function isValidWebhookId(id: string): boolean {
  return typeof id === 'string' && ID.test(id);
}
