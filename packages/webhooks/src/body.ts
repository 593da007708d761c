import { WebhookError } from './errors.js';

/** A webhook body as raw bytes. A string is taken as its UTF-8 bytes. */
export type WebhookBody = Uint8Array | ArrayBuffer | string;

/**
 * Returns the exact bytes of a raw body, without copying a Buffer. Anything else (a parsed object,
 * `undefined`) throws `raw_body_required`: a signature can only be checked over the bytes that were
 * signed, and re-serialising parsed JSON changes them (key order, spacing, escapes, numbers).
 *
 * @example
 * toBodyBytes(req.body); // Buffer, when express.raw() or our glue read the body
 */
export function toBodyBytes(body: unknown): Buffer {
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (body instanceof ArrayBuffer) return Buffer.from(body);
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  const got =
    body === null
      ? 'null'
      : Array.isArray(body)
        ? 'an array'
        : typeof body === 'object'
          ? 'a parsed object'
          : typeof body;
  throw new WebhookError(
    'raw_body_required',
    `Webhook verification needs the raw request body (a Buffer or string) but got ${got}. ` +
      'A body parser (such as express.json()) ran before this route; mount the webhook route before it or use a raw parser.',
    { details: { received: got } },
  );
}
