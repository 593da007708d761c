/** What fetch needs of a message to send it at all. */
interface Deliverable {
  url: string | URL;
  contentType?: string | undefined;
  headers?: Record<string, string> | undefined;
}

/**
 * Throws a `TypeError` for a message fetch would refuse on every attempt: a URL that is not http: or
 * https:, a header name or value fetch refuses, a header value that is not a string, a content type
 * that is not a string. Retried, such a message fails until the horizon and only then surfaces as a
 * dead letter; refused, it fails once, in the call that made it.
 *
 * @example
 * assertDeliverable({ url: 'mailto:ops@example.com' }); // throws TypeError
 */
export function assertDeliverable(message: Deliverable): void {
  let protocol: string;
  try {
    protocol = new URL(message.url).protocol;
  } catch (error) {
    throw new TypeError('url must be an absolute http: or https: URL', { cause: error });
  }
  if (protocol !== 'http:' && protocol !== 'https:') throw new TypeError('url must be an http: or https: URL');
  const headers: unknown = message.headers ?? {};
  if (typeof headers !== 'object' || headers === null || !Object.values(headers).every((v) => typeof v === 'string'))
    throw new TypeError('headers must map header names to strings');
  if (message.contentType !== undefined && typeof message.contentType !== 'string')
    throw new TypeError('contentType must be a string');
  try {
    new Headers({ ...(headers as Record<string, string>), 'content-type': message.contentType ?? 'application/json' });
  } catch (error) {
    throw new TypeError('headers and contentType must be valid HTTP header names and values', { cause: error });
  }
}
