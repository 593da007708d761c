import { isPlainObject } from '@idem/core';
import { isValidWebhookId } from './headers.js';

/** What fetch and the signer need of a message to send it at all. */
interface Deliverable {
  url: string | URL;
  id: string;
  contentType?: string | undefined;
  headers?: Record<string, string> | undefined;
}

/**
 * Throws a `TypeError` for a message no attempt could send: a URL that is not http: or https:, an id
 * that cannot be a `webhook-id` (the signer refuses it), a header name or value fetch refuses, a
 * header value that is not a string, a header the sender sets itself (the signer's three, `content-type`) or
 * never sends as given (`content-length`), a content type that is not a string. Retried, such a message fails until the horizon and only then surfaces as a
 * dead letter; refused, it fails once, in the call that made it.
 *
 * @example
 * assertDeliverable({ url: 'mailto:ops@example.com', id: 'evt_1' }); // throws TypeError
 * assertDeliverable({ url: 'https://example.com/hooks', id: 'a.b' }); // throws TypeError
 */
export function assertDeliverable(message: Deliverable): void {
  let url: URL;
  try {
    url = new URL(message.url);
  } catch {
    // No cause: the parser's error holds the whole URL, a password in its userinfo included.
    throw new TypeError('url must be an absolute http: or https: URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new TypeError('url must be an http: or https: URL');
  // fetch refuses to build a request from a URL with credentials in it, on every attempt; and in the
  // outbox the url is stored, listed by deadLetters() and told to onAttempt: a password there leaks.
  // Never quoted.
  if (url.username !== '' || url.password !== '')
    throw new TypeError('url must not hold a user name or password: send credentials in headers (authorization)');
  if (!isValidWebhookId(message.id))
    throw new TypeError('id must be 1 to 256 printable ASCII characters without spaces or dots');
  assertSendableHeaders(message.headers, message.contentType);
}

// Set by the signer on every attempt (see signature.ts).
const signerHeaders: ReadonlySet<string> = new Set(['webhook-id', 'webhook-timestamp', 'webhook-signature']);

/**
 * The header names (lower case) that never go out as a caller gave them: the sender drops
 * `content-length` (fetch counts the body), `contentType` sets `content-type`, and the signer sets its
 * three. All five are refused where headers are given (see assertSendableHeaders); the sender still
 * drops and replaces them in a row an earlier version stored, and the outbox leaves them out when it
 * compares two events as sent, so such a row compares as it is sent.
 */
export const headersNotSentAsGiven: readonly string[] = ['content-length', 'content-type', ...signerHeaders];

// Hop-by-hop fields the connection owns: undici throws for any value of them (`expect` as not supported).
const refusedWhenSent: ReadonlySet<string> = new Set(['transfer-encoding', 'keep-alive', 'upgrade', 'expect']);

/**
 * Throws a `TypeError` for headers fetch would refuse (a bad name or value, a value that is not a
 * string), headers that are not a plain object (a `Headers` or a `Map` would lose every entry), one
 * name given twice in two spellings (`X-A` and `x-a`), a header every attempt sets itself (the
 * signer's `webhook-id`, `webhook-timestamp` and `webhook-signature`, and `content-type`, which
 * comes from `contentType`), a `content-length` (fetch counts the body, so it never goes out as
 * given), in any case, or a content type that is not a string: checked once,
 * where they are given. Rows an earlier version stored with such headers are not checked again: the
 * relay's attempts send them, with the signer's headers and the row's content type.
 *
 * @example
 * assertSendableHeaders({ 'x-tenant': 't1' }); // fine
 */
export function assertSendableHeaders(given: Record<string, string> | undefined, contentType?: string): void {
  const headers: unknown = given ?? {};
  if (typeof headers !== 'object' || headers === null || !Object.values(headers).every((v) => typeof v === 'string'))
    throw new TypeError('headers must map header names to strings');
  // A Headers or a Map keeps its entries where Object.entries does not look: it would pass the
  // check above and go out (or be stored) with none of them. A plain object of another realm (a vm
  // context's) is plain: @idem/core's isPlainObject, the rule its canonical JSON uses.
  if (!isPlainObject(headers))
    throw new TypeError('headers must be a plain object (for a Headers or a Map, pass Object.fromEntries(it))');
  if (contentType !== undefined && typeof contentType !== 'string') throw new TypeError('contentType must be a string');
  // One field spelt twice (`X-A` and `x-a`): the sender lower-cases names, so only one of the two
  // values would go out, and which one depends on key order (the outbox's jsonb reorders keys).
  // Refused rather than guessed or joined: a joined value is another value than either of them.
  const seen = new Set<string>();
  for (const name of Object.keys(headers)) {
    const lower = name.toLowerCase();
    if (seen.has(lower)) throw new TypeError(`header ${JSON.stringify(lower)} is given twice, in two spellings`);
    seen.add(lower);
    // Every attempt sets these itself, so a caller's value would be replaced in silence: a
    // `content-type: text/plain` without `contentType` went out as application/json. Refused even
    // when it equals what goes out: sender-level headers have no contentType to compare with, and a
    // rule that holds for one value and not another is harder to keep than "not here".
    if (signerHeaders.has(lower))
      throw new TypeError(`header ${JSON.stringify(lower)} is the signer's own, set on every attempt: leave it out`);
    if (lower === 'content-type')
      throw new TypeError('header "content-type" is set from contentType: pass contentType on the message instead');
    // Dropped in silence before: fetch counts the body itself, and a caller's length could only agree
    // with it or make undici refuse every attempt. Refused as the four above are, for one rule.
    if (lower === 'content-length')
      throw new TypeError('header "content-length" is counted from the body on every attempt: leave it out');
  }
  // Named, never quoted: fetch's own error holds the value, which may be a partner's credential.
  const entries = Object.entries({
    ...(headers as Record<string, string>),
    'content-type': contentType ?? 'application/json',
  });
  for (const [name, value] of entries) {
    try {
      new Headers([[name, value]]);
      // Node's fetch (undici) takes these into a Headers object but refuses them when it sends, so
      // every attempt would fail as a network error until the horizon.
      if (refusedWhenSent.has(name.toLowerCase())) throw new TypeError(name);
    } catch {
      const which =
        name === 'content-type' && contentType !== undefined ? 'contentType' : `header ${JSON.stringify(name)}`;
      throw new TypeError(`${which} is not a valid HTTP header name and value`);
    }
  }
}
