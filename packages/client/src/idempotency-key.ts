/**
 * How the client writes a key it made into the `Idempotency-Key` field:
 * - `'sf-string'` (default): an RFC 9651 string, `"8e03..."`, as draft-ietf-httpapi-idempotency-key-header
 *   requires. idem servers, and any server that parses the draft's syntax, read the key inside the quotes.
 * - `'bare'`: the key alone, `8e03...`, for servers that compare the raw field value (Stripe-style).
 *
 * A key the server minted is always sent back byte for byte as the server wrote it.
 *
 * @example
 * createClient({ baseUrl, keyFormat: 'bare' });
 */
export type KeyFormat = 'sf-string' | 'bare';

/**
 * A fresh idempotency key: a random UUIDv4 from the platform's CSPRNG (`crypto.randomUUID`, or
 * `crypto.getRandomValues` where `randomUUID` is missing, as in non-secure browser contexts).
 *
 * @example
 * newIdempotencyKey(); // '3b241101-e2bb-4255-8caf-4136c566a962'
 */
export function newIdempotencyKey(): string {
  const webCrypto = globalThis.crypto;
  if (webCrypto && typeof webCrypto.randomUUID === 'function') return webCrypto.randomUUID();
  if (!webCrypto || typeof webCrypto.getRandomValues !== 'function') {
    throw new TypeError('no Web Crypto in this runtime: pass idempotencyKey yourself');
  }
  const bytes = webCrypto.getRandomValues(new Uint8Array(16));
  // RFC 9562: version 4 in the high nibble of byte 6, variant 10 in the top bits of byte 8.
  bytes[6] = ((bytes[6] as number) & 0x0f) | 0x40;
  bytes[8] = ((bytes[8] as number) & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

// Printable ASCII: everything an sf-string can carry. Anything else cannot be written unambiguously.
const printable = /^[\x20-\x7e]+$/;
// Visible ASCII without the characters that make a bare value a list, a parameter or a quoted string.
const bareToken = /^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+$/;

/**
 * Writes a key as an `Idempotency-Key` field value in the given format. Throws a `TypeError` for a
 * key that the format cannot carry (empty, only spaces, non-ASCII or control characters; in `'bare'`
 * format also spaces, `"`, `,`, `;` and `\`).
 *
 * @example
 * formatKeyField('abc', 'sf-string'); // '"abc"'
 * formatKeyField('abc', 'bare');      // 'abc'
 */
export function formatKeyField(key: string, format: KeyFormat): string {
  if (typeof key !== 'string' || !printable.test(key) || key.trim().length === 0) {
    throw new TypeError('idempotencyKey must be a non-empty string of printable ASCII characters');
  }
  if (format === 'bare') {
    if (!bareToken.test(key)) throw new TypeError("idempotencyKey has characters that keyFormat 'bare' cannot carry");
    return key;
  }
  return `"${key.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;
}

/**
 * Reads the key out of an `Idempotency-Key` field value: the inside of an sf-string (parameters
 * ignored) or a bare value. `undefined` when the value is neither, for example two keys joined by a
 * comma, so an ambiguous minted key is never adopted.
 *
 * @example
 * parseKeyField('"abc";v=1'); // 'abc'
 * parseKeyField('abc');       // 'abc'
 * parseKeyField('a, b');      // undefined
 */
export function parseKeyField(value: string | null | undefined): string | undefined {
  if (value === null || value === undefined) return undefined;
  const text = value.trim();
  if (text.length === 0) return undefined;
  if (!text.startsWith('"')) return bareToken.test(text) ? text : undefined;
  let key = '';
  let i = 1;
  for (;;) {
    const c = text[i];
    if (c === undefined) return undefined;
    if (c === '\\') {
      const next = text[i + 1];
      if (next !== '"' && next !== '\\') return undefined;
      key += next;
      i += 2;
      continue;
    }
    if (c === '"') break;
    if (!printable.test(c)) return undefined;
    key += c;
    i++;
  }
  const rest = text.slice(i + 1);
  // Only parameters may follow the string; a comma means a second list member.
  if (rest.length > 0 && (!rest.startsWith(';') || rest.includes(','))) return undefined;
  return key.length > 0 ? key : undefined;
}
