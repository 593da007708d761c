import type { IncomingMessage } from 'node:http';
import { assertKnownOptions, isPlainObject, notify } from '@idem/core';
import { isWebhookError, WebhookError } from './errors.js';
import { bodyLimitOf, bodyTooLarge } from './raw-body.js';
import { type Receiver, type ReceiverResponse, reportGlueRejection } from './receiver.js';

/** Options shared by the Express, Fastify and Koa glue. */
export interface GlueOptions {
  /** Largest body in bytes, after decompression. Default 1 MiB. */
  limit?: number | undefined;
  /**
   * Called with a `raw_body_required` error (the server is misconfigured: the body was parsed before
   * the webhook route), on every such request. Default: one `process.emitWarning` per route (per
   * options object), so the deployment bug is visible in logs while the sender, answered 500, keeps
   * retrying, without a line per delivery attempt.
   */
  onMisconfigured?: ((error: WebhookError) => void) | undefined;
}

const glueOptionNames = ['limit', 'onMisconfigured'] as const satisfies readonly (keyof GlueOptions)[];

/**
 * Checks a glue's options when the glue is built, as the factories of the package check theirs: a
 * misspelt name (`bodyLimit` for `limit`) would otherwise be ignored, its default used in silence.
 * Returns the body limit. `extra` names the glue's own options besides the shared ones.
 *
 * @example
 * const limit = checkGlueOptions(options, 'expressWebhook');
 */
export function checkGlueOptions(options: GlueOptions, glue: string, extra: readonly string[] = []): number {
  if (options === null || typeof options !== 'object') throw new TypeError(`${glue}: options must be an object`);
  assertKnownOptions(options, new Set([...glueOptionNames, ...extra]), glue);
  if (options.onMisconfigured !== undefined && typeof options.onMisconfigured !== 'function') {
    throw new TypeError(`${glue}: onMisconfigured must be a function`);
  }
  // Checked once, here: at the first request it would answer every delivery 500.
  return bodyLimitOf(options.limit);
}

// The options objects of routes that already warned. Each glue call holds its own options object
// (a default `{}` is made per call), so this is one warning per route, or per group of routes that
// share one options object: a misconfigured server that takes thousands of retried deliveries must
// not write a warning for each.
const warned = new WeakSet<GlueOptions>();

/**
 * Turns a glue-level {@link WebhookError} into the response to send, or `undefined` for other errors,
 * and reports it through the receiver's `onEvent` (one event per delivery, refused ones included).
 */
export function glueErrorResponse(
  error: unknown,
  options: GlueOptions,
  receiver: Receiver,
): ReceiverResponse | undefined {
  if (!isWebhookError(error)) return undefined;
  reportGlueRejection(receiver, error);
  if (error.code === 'raw_body_required') {
    // A failing hook must not turn the misconfiguration answer into a crash.
    if (options.onMisconfigured) notify(options.onMisconfigured, error);
    else if (!warned.has(options)) {
      warned.add(options);
      process.emitWarning(error.message, { code: 'IDEM_WEBHOOK_RAW_BODY' });
    }
  }
  return {
    status: error.status,
    headers: { 'content-type': 'application/problem+json' },
    body: Buffer.from(JSON.stringify(error.toProblem())),
    outcome: 'rejected',
  };
}

/**
 * `body`, a Buffer a parser on the route already read (express.raw(), a Koa body parser), held to the
 * glue's `limit` as a body the glue reads itself, and as Fastify's handler holds its parsed Buffer:
 * one outcome in every framework, 413 `body_too_large`. A parser's larger limit does not lift it.
 *
 * @example
 * withinLimit(Buffer.alloc(2048), 1024); // throws WebhookError body_too_large
 */
export function withinLimit(body: Buffer, limit: number): Buffer {
  if (body.length > limit) throw bodyTooLarge(limit);
  return body;
}

/**
 * Accepts a body a framework already read only if it is still the exact bytes (a Buffer). An object
 * or a string was parsed or decoded with a charset, so its bytes may differ from the signed ones.
 */
export function requireBuffer(body: unknown, hint: string): Buffer {
  if (Buffer.isBuffer(body)) return body;
  const got = typeof body === 'string' ? 'a decoded string' : body === null ? 'null' : `a parsed ${typeof body}`;
  throw new WebhookError(
    'raw_body_required',
    `Webhook verification needs the raw request body but a body parser produced ${got}. ${hint}`,
    {
      details: { received: got },
    },
  );
}

/**
 * True when a framework's `body` is only a placeholder over a stream nobody read: an empty plain
 * object (of any realm), no parser's "I parsed it" flag, and not a byte taken from the stream.
 * Express 4's body-parser sets `req.body = {}` on every request it skips (another content type), so a form or
 * JSON parser mounted app-wide would otherwise make every webhook fail closed although the exact
 * bytes are still there to read. A parser that did read (even a body of `{}`) sets `req._body` and
 * drains the stream, so that case still fails closed.
 */
export function isUnreadPlaceholder(body: unknown, request: IncomingMessage): boolean {
  // Core's test of a plain object, not `Object.prototype` itself: a parser running in another realm
  // (a node:vm context) leaves its own realm's `{}`, as much a placeholder as ours.
  if (!isPlainObject(body) || Object.keys(body).length > 0) return false;
  if ((request as IncomingMessage & { _body?: unknown })._body === true) return false;
  return !request.readableDidRead && !request.readableEnded;
}
