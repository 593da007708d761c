import type { IncomingMessage } from 'node:http';
import {
  checkGlueOptions,
  type GlueOptions,
  glueErrorResponse,
  isUnreadPlaceholder,
  requireBuffer,
  withinLimit,
} from './glue.js';
import { readRawBody } from './raw-body.js';
import type { Receiver, ReceiverResponse } from './receiver.js';

/** The parts of a Koa context the middleware uses. */
export interface KoaLikeContext {
  req: IncomingMessage;
  method: string;
  path: string;
  request: { body?: unknown };
  status: number;
  body: unknown;
  set(name: string, value: string): void;
}

/** Options of {@link koaWebhook}. */
export interface KoaWebhookOptions extends GlueOptions {
  /** Only `POST` to this path is handled; other requests pass to `next`. Omit when mounted on a router route. */
  path?: string | undefined;
}

/**
 * Koa middleware for a {@link Receiver}. It reads the raw body itself. If a body parser ran first
 * (`ctx.request.body` is set, or the stream was consumed), it fails closed with 500
 * `raw_body_required`: `ctx.request.rawBody` of @koa/bodyparser is a decoded string, missing for some
 * types and for gzip bodies, so it is never trusted. An empty `{}` over a stream nobody read is a
 * request the parser skipped, not a parsed one: its stream is read.
 *
 * @example
 * import Koa from 'koa';
 * const app = new Koa();
 * app.use(koaWebhook(receiver, { path: '/webhooks/payments' })); // before the body parser
 * app.use(bodyParser());
 */
export function koaWebhook(receiver: Receiver, options: KoaWebhookOptions = {}) {
  const limit = checkGlueOptions(options, 'koaWebhook', ['path']);
  const path = options.path;
  return async (ctx: KoaLikeContext, next: () => Promise<unknown>): Promise<void> => {
    if (path !== undefined && (ctx.method !== 'POST' || ctx.path !== path)) {
      await next();
      return;
    }
    let response: ReceiverResponse;
    try {
      const body =
        // koa-bodyparser, like Express 4's, leaves `{}` on a request of a type it skipped, unread.
        ctx.request.body === undefined || isUnreadPlaceholder(ctx.request.body, ctx.req)
          ? await readRawBody(ctx.req, options)
          : withinLimit(
              requireBuffer(ctx.request.body, 'Register the webhook middleware before the body parser.'),
              limit,
            );
      response = await receiver.handle({ headers: ctx.req.headers, body });
    } catch (error) {
      const failed = glueErrorResponse(error, options, receiver);
      if (!failed) throw error;
      response = failed;
    }
    ctx.status = response.status;
    for (const [name, value] of Object.entries(response.headers)) ctx.set(name, value);
    ctx.body = Buffer.from(response.body);
  };
}
