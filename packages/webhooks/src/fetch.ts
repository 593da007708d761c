import { WebhookError } from './errors.js';
import { type GlueOptions, glueErrorResponse } from './glue.js';
import { decodeBody, defaultBodyLimit } from './raw-body.js';
import type { Receiver, ReceiverResponse } from './receiver.js';

/**
 * A handler for fetch-style servers (`(request: Request) => Response`: Hono, Bun, Deno, Next.js
 * route handlers, Cloudflare Workers) for a {@link Receiver}. It reads the body as bytes and fails
 * closed with 500 `raw_body_required` when something already read it (`request.bodyUsed`).
 * A `Content-Encoding` of gzip, deflate or br is decoded; the size limit applies after decoding.
 *
 * @example
 * const handle = fetchWebhook(receiver);
 * export const POST = (request: Request) => handle(request); // a Next.js route handler
 */
export function fetchWebhook(receiver: Receiver, options: GlueOptions = {}) {
  const limit = options.limit ?? defaultBodyLimit;
  return async (request: Request): Promise<Response> => {
    let response: ReceiverResponse;
    try {
      if (request.bodyUsed) {
        throw new WebhookError(
          'raw_body_required',
          'The request body was already read (request.json() or request.text() ran before verification); pass the untouched Request.',
          { details: { received: 'consumed stream' } },
        );
      }
      const declared = Number(request.headers.get('content-length'));
      if (Number.isFinite(declared) && declared > limit) {
        throw new WebhookError('body_too_large', `The webhook body is larger than ${limit} bytes.`, {
          details: { limit },
        });
      }
      const raw = Buffer.from(await request.arrayBuffer());
      const body = await decodeBody(raw, request.headers.get('content-encoding') ?? undefined, { limit });
      response = await receiver.handle({ headers: request.headers, body });
    } catch (error) {
      const failed = glueErrorResponse(error, options);
      if (!failed) throw error;
      response = failed;
    }
    return new Response(response.status === 204 ? null : Buffer.from(response.body), {
      status: response.status,
      headers: response.headers,
    });
  };
}
