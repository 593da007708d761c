import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { HttpResponse } from './http-types.js';
import { streamOf } from './response-state.js';

/**
 * Writes an {@link HttpResponse} straight to Node's response, bypassing the framework, so replays and
 * problems are byte-identical whichever framework serves them.
 *
 * @example
 * writeResponse(res, http.problem(error));
 */
export function writeResponse(res: ServerResponse, response: HttpResponse): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const bodyless = response.status === 204 || response.status === 304;
  const headers: OutgoingHttpHeaders = {};
  // Over HTTP/2, fields about one connection are malformed (RFC 9113 8.2.2): Node throws on them,
  // and a replay stored from an HTTP/1.1 answer may carry one. Left out there.
  const h2 = streamOf(res) !== undefined;
  for (const name in response.headers) {
    if (h2 && connectionSpecific.has(name.toLowerCase())) continue;
    headers[name] = response.headers[name];
  }
  const body = response.body;
  if (!bodyless) headers['content-length'] = String(body.length);
  // HTTP/2 has no reason phrase (Node warns when given one there, or when one is set).
  if (response.statusMessage !== undefined && !h2) res.writeHead(response.status, response.statusMessage, headers);
  else {
    // The status line is this response's own. Node keeps a phrase set on `res` before (a handler's
    // `res.statusMessage`, Koa's `ctx.status`, which sets its status's) over a writeHead without one:
    // idem's 500 in place of a held 201 whose COMMIT was refused went out as `500 Created`.
    if (!h2) res.statusMessage = '';
    res.writeHead(response.status, headers);
  }
  if (bodyless) res.end();
  // Node sends a string body in one write together with the head (a Buffer takes a second chunk and
  // a writev). Latin-1 maps each byte to one character and back, so the bytes on the wire are the
  // very same; large bodies go as they are rather than being copied into a string.
  else {
    const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.length);
    if (bytes.length <= latin1Limit) res.end(bytes.toString('latin1'), 'latin1');
    else res.end(bytes);
  }
}

/**
 * Whether a header field is about one connection, which an HTTP/2 message must not carry (RFC 9113
 * 8.2.2; Node throws on it): for an adapter copying headers onto a response that may be HTTP/2.
 *
 * @example
 * if (!connectionSpecificField('keep-alive')) res.setHeader('keep-alive', 'timeout=5');
 */
export function connectionSpecificField(name: string): boolean {
  return connectionSpecific.has(name.toLowerCase());
}

// The fields HTTP/2 forbids (RFC 9113 8.2.2), as Node refuses them.
const connectionSpecific: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'http2-settings',
  'te',
]);

// Above this, copying the body into a string costs more than the extra chunk it saves.
const latin1Limit = 16_384;

/**
 * A framework's header map (Node's `getHeaders()`, Fastify's `reply.getHeaders()`, Koa's
 * `ctx.response.headers`) as a response's headers: names in lower case, a list joined with `, `,
 * unset ones left out. Into `out` when given.
 *
 * @example
 * headerRecord({ 'Content-Type': 'text/plain', Link: ['<a>', '<b>'] }); // { 'content-type': 'text/plain', link: '<a>, <b>' }
 */
export function headerRecord(raw: Record<string, unknown>, out: Record<string, string> = {}): Record<string, string> {
  const names = Object.keys(raw);
  for (let i = 0; i < names.length; i++) {
    const name = names[i] as string;
    const value = raw[name];
    if (value === undefined) continue;
    out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return out;
}
