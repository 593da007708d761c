import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  checkGlueOptions,
  type GlueOptions,
  glueErrorResponse,
  isUnreadPlaceholder,
  requireBuffer,
  withinLimit,
} from './glue.js';
import { readRawBody } from './raw-body.js';
import type { Receiver } from './receiver.js';

/** The parts of an Express (or plain Node) request the handler uses. */
export type ExpressLikeRequest = IncomingMessage & { body?: unknown };

/**
 * An Express route handler for a {@link Receiver}. It reads the raw body itself (no body parser is
 * needed), or takes the Buffer of `express.raw()`. If a parser already turned the body into an object
 * or a string, or consumed the stream, it fails closed: 500 `raw_body_required`, never a misleading
 * "signature mismatch". The empty `{}` an Express 4 parser leaves on a request it skipped, without
 * reading it, is not a parsed body: the stream is read. Works with a plain `node:http` server too.
 *
 * @example
 * import express from 'express';
 * import { expressWebhook } from '@idem/webhooks';
 * const app = express();
 * app.post('/webhooks/payments', expressWebhook(receiver)); // before app.use(express.json())
 * app.use(express.json());
 */
export function expressWebhook(receiver: Receiver, options: GlueOptions = {}) {
  const limit = checkGlueOptions(options, 'expressWebhook');
  return async (req: ExpressLikeRequest, res: ServerResponse, next?: (error?: unknown) => void): Promise<void> => {
    let response: Awaited<ReturnType<Receiver['handle']>>;
    try {
      // A Buffer from express.raw() holds the exact (already decompressed) bytes; any other parsed
      // value lost them. Express 4's parsers leave `{}` on a request they skipped, stream unread.
      const body =
        req.body === undefined || isUnreadPlaceholder(req.body, req)
          ? await readRawBody(req, options)
          : withinLimit(
              requireBuffer(
                req.body,
                'Mount the webhook route before express.json()/express.text(), or use express.raw() on it.',
              ),
              limit,
            );
      response = await receiver.handle({ headers: req.headers, body });
    } catch (error) {
      const failed = glueErrorResponse(error, options, receiver);
      if (failed) response = failed;
      else if (typeof next === 'function') return next(error);
      else {
        // A plain node:http server has no error handler to pass it to. Usually the sender hung up
        // mid-body and there is nobody to answer; otherwise it gets a bare 500 and retries.
        if (!res.headersSent && !res.destroyed) res.writeHead(500).end();
        return;
      }
    }
    res.statusCode = response.status;
    for (const [name, value] of Object.entries(response.headers)) res.setHeader(name, value);
    res.end(Buffer.from(response.body));
  };
}
