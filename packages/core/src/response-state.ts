import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';

// An Http2ServerResponse (Node's HTTP/2 compatibility API, which Fastify's `http2: true` and a Koa
// app on `http2.createServer` write to) has neither `errored` nor `destroyed`; its stream has both.
// A client's RST_STREAM (CANCEL) destroys the stream without an error, as a client leaving an
// HTTP/1.1 connection does; a failed pipeline into the response destroys it with one.
// Only an Http2ServerResponse has a `stream`: its presence is what says a response is HTTP/2.
export function streamOf(res: ServerResponse): Readable | undefined {
  return (res as { stream?: Readable }).stream;
}

// Compared as it is: a ServerResponse's `errored` is null until `destroy()`, which sets it to its
// argument, undefined too, so `destroy()` without an error shows as well.
export function erroredOf(res: ServerResponse): Error | null | undefined {
  return 'errored' in res ? res.errored : streamOf(res)?.errored;
}

/**
 * Whether the client is gone: its connection (or, over HTTP/2, its stream) closed. An adapter asks
 * once its key is claimed: a client that left while the claim waited on a slow store gets no handler
 * (body parsers skip a request whose socket is gone, so it would run without the body it sent); the
 * key is released and the retry runs as the first attempt would have.
 *
 * @example
 * if (clientLeft(req, res)) return void (await http.engine.release(lease));
 */
export function clientLeft(req: IncomingMessage, res: ServerResponse): boolean {
  return destroyedOf(res) || req.socket?.destroyed === true;
}

/**
 * Whether the response can take no more: destroyed, or, over HTTP/2, its stream is.
 *
 * @example
 * if (destroyedOf(ctx.res)) return; // the client reset its stream
 */
export function destroyedOf(res: ServerResponse): boolean {
  return res.destroyed === true || streamOf(res)?.destroyed === true;
}
