import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
import { carriesBody } from '@idem/core';
import { checkGlueOptions, type GlueOptions, glueErrorResponse, requireBuffer } from './glue.js';
import { bodyTooLarge, decodeBody, readRawBody } from './raw-body.js';
import type { Receiver, ReceiverResponse } from './receiver.js';

/** The parts of a Fastify request the handler uses. */
export interface FastifyLikeRequest {
  headers: IncomingHttpHeaders;
  body?: unknown;
  /**
   * Node's request: read here when Fastify left an HTTP/2 body unparsed (no Content-Type, no length).
   * An HTTP/2 one on an `http2: true` instance, so both are accepted (an IncomingMessage alone made
   * the handler refuse such an instance's routes at compile time).
   */
  raw?: IncomingMessage | Http2ServerRequest;
}

/** The parts of a Fastify reply the handler uses. */
export interface FastifyLikeReply {
  code(status: number): FastifyLikeReply;
  header(name: string, value: string): FastifyLikeReply;
  send(payload: Buffer): unknown;
}

/** The parts of a Fastify instance {@link fastifyWebhook} uses. */
export interface FastifyLikeInstance {
  removeAllContentTypeParsers(): void;
  addContentTypeParser(
    contentType: string,
    options: { parseAs: 'buffer'; bodyLimit?: number },
    parser: (request: any, body: Buffer, done: (error: Error | null, body?: Buffer) => void) => void,
  ): void;
  post(path: string, handler: (request: any, reply: any) => Promise<unknown>): unknown;
  setErrorHandler(handler: (error: any, request: any, reply: any) => unknown): unknown;
  addHook(name: 'onRequest', hook: (request: any) => Promise<void>): unknown;
}

/** Options of {@link fastifyWebhook}. */
export interface FastifyWebhookOptions extends GlueOptions {
  /** The route path, e.g. `/webhooks/payments`. */
  path: string;
}

const hasNoBody = (headers: IncomingHttpHeaders) =>
  headers['transfer-encoding'] === undefined &&
  (headers['content-length'] === undefined || headers['content-length'] === '0');

/**
 * A Fastify route handler for a {@link Receiver}. The route must receive its body as a Buffer (as
 * {@link fastifyWebhook} arranges); under Fastify's default JSON parser the body is an object and the
 * handler fails closed with 500 `raw_body_required`. A `Content-Encoding` is decoded here, since
 * Fastify's buffer parser keeps it.
 *
 * @example
 * app.register(async (scope) => {
 *   scope.removeAllContentTypeParsers();
 *   scope.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
 *   scope.post('/webhooks/payments', fastifyWebhookHandler(receiver));
 * });
 */
export function fastifyWebhookHandler(receiver: Receiver, options: GlueOptions = {}) {
  const limit = checkGlueOptions(options, 'fastifyWebhookHandler');
  return async (request: FastifyLikeRequest, reply: FastifyLikeReply): Promise<unknown> => {
    let response: ReceiverResponse;
    try {
      let body: Buffer;
      const raw = request.raw;
      if (request.body === undefined && raw !== undefined && carriesBody(raw) && !raw.readableEnded) {
        // A body Fastify did not parse, still in the request: over HTTP/2 one comes without
        // Content-Length or Transfer-Encoding (RFC 9113 8.1.1), and Fastify, reading HTTP/1.1's rule,
        // takes it for none.
        body = await readRawBody(raw, { limit });
      } else {
        const parsed =
          request.body === undefined && hasNoBody(request.headers)
            ? Buffer.alloc(0)
            : requireBuffer(
                request.body,
                "Register the route with a buffer parser (parseAs: 'buffer'), e.g. with fastifyWebhook().",
              );
        body = await decodeBody(parsed, request.headers['content-encoding'], { limit });
      }
      response = await receiver.handle({ headers: request.headers, body });
    } catch (error) {
      const failed = glueErrorResponse(error, options, receiver);
      if (!failed) throw error;
      response = failed;
    }
    return sendResponse(reply, response);
  };
}

function sendResponse(reply: FastifyLikeReply, response: ReceiverResponse): unknown {
  reply.code(response.status);
  for (const [name, value] of Object.entries(response.headers)) reply.header(name, value);
  return reply.send(Buffer.from(response.body));
}

/**
 * A Fastify plugin that registers `POST path` for a {@link Receiver}, with a catch-all buffer parser
 * scoped to this plugin only (Fastify encapsulation): the rest of the app keeps its JSON parser, the
 * webhook route gets the exact bytes.
 *
 * @example
 * import Fastify from 'fastify';
 * const app = Fastify();
 * app.register(fastifyWebhook(receiver, { path: '/webhooks/payments' }));
 */
export function fastifyWebhook(receiver: Receiver, options: FastifyWebhookOptions) {
  if (!options || typeof options.path !== 'string' || !options.path.startsWith('/')) {
    throw new TypeError("fastifyWebhook needs a path starting with '/'");
  }
  const limit = checkGlueOptions(options, 'fastifyWebhook', ['path']);
  const { path: _path, ...glue } = options;
  const handler = fastifyWebhookHandler(receiver, glue);
  return async (instance: FastifyLikeInstance): Promise<void> => {
    instance.removeAllContentTypeParsers();
    // The wire limit also bounds compressed bodies; decodeBody bounds what they expand to.
    instance.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: limit }, (_request, body, done) =>
      done(null, body),
    );
    // Fastify's parser refuses a body over its bodyLimit itself, with its own JSON error; the other
    // glue answer that with the receiver's problem (`body_too_large`), so this scope does too. Other
    // errors go on to the app's handler.
    instance.setErrorHandler((error, _request, reply) => {
      if ((error as { code?: unknown } | null)?.code !== 'FST_ERR_CTP_BODY_TOO_LARGE') throw error;
      return sendResponse(reply, glueErrorResponse(bodyTooLarge(limit), options, receiver) as ReceiverResponse);
    });
    instance.addHook('onRequest', dropUnreadableContentType);
    instance.post(options.path, handler);
  };
}

// A Content-Type Fastify cannot read (empty, no `type/subtype`, two values a proxy joined with a
// comma) makes Fastify refuse the request itself, 415 in its own JSON, before any parser runs, the
// catch-all one included: no problem body, no `onEvent`, and the sender retries a delivery whose
// signature (over the bytes, never the media type) may be good. Express and Koa apply it. On this
// route it is dropped, so the body is read as one without a type; the app's later hooks see none.
// From Node's headers too: once an app hook set `request.headers`, Fastify's getter merges a fresh
// copy over them at every read, and a delete from that copy alone left Fastify its 415.
async function dropUnreadableContentType(request: FastifyLikeRequest): Promise<void> {
  const type = request.headers['content-type'];
  if (type === undefined || fastifyReads(type)) return;
  delete request.headers['content-type'];
  if (request.raw !== undefined) delete request.raw.headers['content-type'];
}

// Fastify's own reading of a media type (its ContentType): `type/subtype` of token characters before
// any `;`, the type trimmed at its start, the subtype at its end.
const typeToken = /^[\w!#$%&'*+.^`|~-]+$/;
function fastifyReads(value: string): boolean {
  if (value === 'undefined') return false;
  const semicolon = value.indexOf(';');
  const mediaType = semicolon === -1 ? value : value.slice(0, semicolon);
  const slash = mediaType.indexOf('/');
  if (slash === -1) return false;
  return typeToken.test(mediaType.slice(0, slash).trimStart()) && typeToken.test(mediaType.slice(slash + 1).trimEnd());
}
