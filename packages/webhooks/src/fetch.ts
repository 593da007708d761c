import { Readable } from 'node:stream';
import { WebhookError } from './errors.js';
import { checkGlueOptions, type GlueOptions, glueErrorResponse } from './glue.js';
import { readBodyStream } from './raw-body.js';
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
  const limit = checkGlueOptions(options, 'fetchWebhook');
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
      response = await receiver.handle({ headers: request.headers, body: await readFetchBody(request, limit) });
    } catch (error) {
      const failed = glueErrorResponse(error, options, receiver);
      if (!failed) throw error;
      response = failed;
    }
    return new Response(response.status === 204 ? null : Buffer.from(response.body), {
      status: response.status,
      headers: response.headers,
    });
  };
}

// Read as a stream, counting while reading: `arrayBuffer()` would take in whatever a sender without a
// Content-Length sends before the limit could be checked.
async function readFetchBody(request: Request, limit: number): Promise<Buffer> {
  if (request.body === null) return Buffer.alloc(0);
  const source = Readable.fromWeb(request.body as import('node:stream/web').ReadableStream);
  try {
    return await readBodyStream(
      source,
      request.headers.get('content-encoding') ?? undefined,
      request.headers.get('content-length'),
      limit,
    );
  } finally {
    // Stops the rest of an over-limit body from being read.
    source.destroy();
  }
}
