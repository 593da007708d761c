import type { IncomingMessage } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
import type { Readable } from 'node:stream';
import { markDecoded, markUndecodable } from './body-refusal.js';
import { decoderOf } from './content-coding.js';
import { IdempotencyError } from './errors.js';
import { isJsonContentType } from './fingerprint.js';

export const incompleteBody = () =>
  new IdempotencyError(
    'body_incomplete',
    'The request body ended before it was complete; send it again with the same key.',
  );

export const tooLarge = (limit: number) =>
  new IdempotencyError('body_too_large', `The request body is larger than ${limit} bytes.`);

/** What a body reader passed to {@link HttpIdempotency.begin} resolves to. */
export type BodyRead =
  | {
      ok: true;
      body: Uint8Array | undefined;
      /** The body as a parser that ran first left it, when `body` (the raw bytes) is gone. */
      json?: unknown;
    }
  | { ok: false; error: IdempotencyError };

/** The result of {@link readRequestBody}. */
export type ReadBodyResult = { ok: true; body: Buffer | undefined } | { ok: false; error: IdempotencyError };

/**
 * Reads a Node request body into memory, up to `maxBytes`, and puts the bytes back into the stream
 * with `unshift`, so a body parser that runs afterwards (express.json, @koa/bodyparser, multer) reads
 * the very same bytes as if nothing had happened. Over the limit: 413 at once, nothing hashed.
 * When the stream was already consumed by an earlier parser, resolves `{ ok: true, body: undefined }`.
 *
 * @example
 * const read = await readRequestBody(req, 1_048_576);
 * if (!read.ok) return send(problem(read.error));
 */
export function readRequestBody(req: IncomingMessage, maxBytes: number): Promise<ReadBodyResult> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > maxBytes)
    return Promise.resolve({ ok: false, error: tooLarge(maxBytes) });
  if (req.readableEnded || (req.complete && req.readableLength === 0)) {
    return Promise.resolve({ ok: true, body: undefined });
  }
  if (!carriesBody(req)) return Promise.resolve({ ok: true, body: undefined });
  // A chunked body may be empty (`0\r\n\r\n` alone), and its last chunk may sit in the packet whose
  // head is being parsed while this runs. A listener added now would read the ended, empty request
  // on the next tick, and its 'end' would go out before the body parser listens: nothing can be put
  // back to take it back (see readAvailable), and the parser finds the request closed (body-parser
  // leaves no body, @koa/bodyparser answers 499). Looked at once the packet is parsed, it is whole
  // and untouched, and left to the parser.
  if (!Number.isFinite(declared) && req.httpVersionMajor !== 2) {
    return Promise.resolve().then(() =>
      req.readableEnded || (req.complete && req.readableLength === 0)
        ? { ok: true, body: undefined }
        : startReading(req, maxBytes, 'readable'),
    );
  }
  return startReading(req, maxBytes, 'readable');
}

/**
 * Whether a request carries a body, by its framing. HTTP/1.1 frames one by Content-Length or
 * Transfer-Encoding, and neither means none (RFC 9112 6.3). HTTP/2 frames it by DATA frames and
 * END_STREAM: Content-Length is optional there and Transfer-Encoding never sent (RFC 9113 8.1.1,
 * 8.2.2), so a request without either may well carry one (left unread, it would go unfingerprinted
 * and unbounded); it has none only when its stream ended with its headers.
 *
 * @example
 * if (!carriesBody(req)) return { ok: true, body: undefined };
 */
export function carriesBody(req: IncomingMessage | Http2ServerRequest): boolean {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared)) return declared > 0;
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const h2 = (req as { stream?: { endAfterHeaders?: boolean } }).stream;
  return req.httpVersionMajor === 2 && h2 !== undefined && h2.endAfterHeaders !== true;
}

/** What a body parser that ran before the middleware left on the request. */
export interface ParsedBodyFields {
  /** The raw text or bytes some parsers keep (e.g. with a `verify` hook, or koa-bodyparser). */
  rawBody?: unknown;
  /** The parsed body. */
  body?: unknown;
}

/**
 * The body to fingerprint: the raw bytes read with {@link readRequestBody} (and put back for later
 * parsers), or, when a parser that ran first already drained the stream, what it left in `parsed`:
 * its raw bytes if it kept them, else the parsed body, which the fingerprint canonicalises as it is
 * (no round trip through text).
 *
 * @example
 * const read = await readBodyForFingerprint(req, 1_048_576, req);
 */
export async function readBodyForFingerprint(
  req: IncomingMessage,
  maxBytes: number,
  parsed: ParsedBodyFields,
): Promise<BodyRead> {
  const read = await readRequestBody(req, maxBytes);
  if (!read.ok) return read;
  if (read.body !== undefined) {
    return decodeRequestBody(read.body, req.headers['content-encoding'], maxBytes);
  }
  return parsedBodyRead(parsed, req.headers['content-type']);
}

/**
 * The bytes of a request body to fingerprint, decoded by its `Content-Encoding`: a compressed body is
 * fingerprinted by what it says, as the parser after us will read it, so the same JSON compressed
 * twice (gzip writes a timestamp into its header) or once sent plain is one request. Decoded up to
 * `maxBytes` (413 past it: a small bomb must not expand); a body that does not decode is left as it
 * came, and marked so: the parser will refuse it, and that refusal releases the key (see
 * `markUndecodable`). Without an encoding, the body as it is. Exported for an adapter that reads the
 * raw body itself and hands the encoded bytes on to the framework (Fastify: `@fastify/compress`
 * decodes them after the plugin's hook).
 *
 * @example
 * const read = decodeRequestBody(body, request.headers['content-encoding'], 1_048_576);
 */
export function decodeRequestBody(body: Buffer, encoding: string | undefined, maxBytes: number): ReadBodyResult {
  if (encoding === undefined) return { ok: true, body };
  const decode = decoderOf(encoding.trim().toLowerCase());
  if (decode === undefined) return { ok: true, body };
  try {
    const decoded = decode(body, { maxOutputLength: maxBytes });
    // A parser that does not decode refuses the bytes as sent: still this request's refusal.
    markDecoded(decoded, body);
    return { ok: true, body: decoded };
  } catch (error) {
    if ((error as { code?: unknown }).code === 'ERR_BUFFER_TOO_LARGE') return { ok: false, error: tooLarge(maxBytes) };
    // The parser meets the same error and refuses the body: its 400 must release the key.
    markUndecodable(body);
    return { ok: true, body };
  }
}

/**
 * The body to fingerprint from what a parser left: its raw bytes if it kept them, else the parsed
 * body. Bytes are bytes. A string is the body's text, except under a JSON `contentType`, where it is
 * the JSON string a parser made of the body (`express.json({ strict: false })`, Fastify's parser):
 * the body `"123"` must not fingerprint as the body `123`, nor `"{\"a\":1}"` as `{"a":1}`. Anything
 * else is canonicalised as it is, with no round trip through text, which gives the fingerprint its
 * raw JSON bytes would give.
 *
 * @example
 * const read = parsedBodyRead({ body: request.body }, request.headers['content-type']);
 */
export function parsedBodyRead(parsed: ParsedBodyFields, contentType?: string): BodyRead & { ok: true } {
  const raw = parsed.rawBody;
  if (raw instanceof Uint8Array) return { ok: true, body: raw };
  if (typeof raw === 'string') return { ok: true, body: Buffer.from(raw) };
  const body = parsed.body;
  if (body === undefined || body instanceof Uint8Array) return { ok: true, body };
  if (typeof body === 'string' && !isJsonContentType(contentType)) return { ok: true, body: Buffer.from(body) };
  return { ok: true, body: undefined, json: body };
}

/** One body being read into memory; its listeners are shared functions bound to it. */
interface BodyReading<S extends Readable> {
  readonly stream: S;
  readonly maxBytes: number;
  readonly chunks: Buffer[];
  size: number;
  readonly resolve: (result: ReadBodyResult) => void;
  onReadable: (() => void) | undefined;
  onData: ((chunk: Buffer | string) => void) | undefined;
  onEnd: (() => void) | undefined;
  onError: (() => void) | undefined;
}

function bodyRead(read: BodyReading<Readable>, result: ReadBodyResult) {
  const stream = read.stream;
  if (read.onReadable) stream.removeListener('readable', read.onReadable);
  if (read.onData) stream.removeListener('data', read.onData);
  stream.removeListener('error', read.onError as () => void);
  stream.removeListener('end', read.onEnd as () => void);
  read.resolve(result);
}

// A stream error (most often the client hanging up mid-upload, or a request timeout) leaves the body
// unknown. Hashed as no body, it would claim the key with the wrong fingerprint and store the
// parser's error, so the client's real retry got a 422: nothing is claimed instead.
function unreadableBody(this: BodyReading<Readable>) {
  bodyRead(this, { ok: false, error: incompleteBody() });
}

// For readRequestBody, 'end' only fires when something else consumed the data; with our own reads
// we stop before it.
function endOfBody(this: BodyReading<Readable>) {
  // An HTTP/2 request whose client reset the stream mid-upload ends its readable side normally, with
  // no 'error' as an HTTP/1.1 one gives: its `aborted` says the body is cut short.
  if ((this.stream as { aborted?: boolean }).aborted === true) {
    bodyRead(this, { ok: false, error: incompleteBody() });
    return;
  }
  bodyRead(this, { ok: true, body: joined(this.chunks) });
}

// The chunks as one buffer. Most bodies arrive in one chunk, which is used as it is: nothing writes
// to a request's chunks, and a copy per request would only be garbage.
function joined(chunks: Buffer[]): Buffer {
  return chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
}

function readAvailable(this: BodyReading<IncomingMessage>) {
  const req = this.stream;
  for (;;) {
    // Never a read of nothing: on an ended request it schedules 'end', which no bytes put back can
    // then cancel, and an empty chunked body would reach the parser as a closed request.
    if (req.readableLength === 0) break;
    const chunk: Buffer | null = req.read();
    if (chunk === null) break;
    this.size += chunk.length;
    if (this.size > this.maxBytes) {
      bodyRead(this, { ok: false, error: tooLarge(this.maxBytes) });
      // The rest is discarded as it arrives: left unread, it would stall the kept-alive connection
      // (Node only drains a body nobody started reading).
      req.resume();
      return;
    }
    this.chunks.push(chunk);
  }
  // `complete` is set when the last byte arrived. Read returned null, so everything is in
  // hand; 'end' is only scheduled for the next tick, and unshifting now cancels it, so the next
  // reader sees the whole body and then its end. An Http2ServerRequest only turns `complete` once
  // its 'end' was emitted, too late to put the bytes back: there, its stream has ended (END_STREAM
  // received and handed over) by the time the last 'readable' comes.
  // An HTTP/2 request its client reset is `complete` too, with only the bytes that came.
  if ((req as { aborted?: boolean }).aborted === true) {
    bodyRead(this, { ok: false, error: incompleteBody() });
    return;
  }
  if (req.complete || lastBytesIn(req)) {
    const body = joined(this.chunks);
    if (body.length > 0) req.unshift(body);
    bodyRead(this, { ok: true, body });
  }
}

// Over HTTP/2: the request's stream ended, so every byte of the body was pushed to the request; an
// aborted one is cut short, which 'end' reports (endOfBody).
function lastBytesIn(req: IncomingMessage): boolean {
  const stream = (req as { stream?: Readable }).stream;
  return stream?.readableEnded === true && (req as { aborted?: boolean }).aborted !== true;
}

/**
 * Reads a whole stream into memory, up to `maxBytes` (for frameworks such as Fastify that hand over the
 * payload stream and accept a replacement). Over the limit resolves `{ ok: false }` with a 413 error.
 * Pass the request's `Content-Length` as `declaredLength`: a declared size over the limit is refused at
 * once, so a client that announces gigabytes and sends a trickle cannot hold the request open.
 *
 * @example
 * const read = await readStream(payload, 1_048_576, request.headers['content-length']);
 */
export function readStream(
  stream: Readable,
  maxBytes: number,
  declaredLength?: string | number,
): Promise<ReadBodyResult> {
  if (declaredLength !== undefined && Number(declaredLength) > maxBytes) {
    return Promise.resolve({ ok: false, error: tooLarge(maxBytes) });
  }
  return startReading(stream, maxBytes, 'data');
}

/**
 * Collects a body with listeners bound to one reading state (no closures per request). An
 * IncomingMessage is read in paused mode (`readable`), so bytes left unread stay in its buffer for a
 * parser; a framework's payload stream flows (`data`).
 */
function startReading(stream: Readable, maxBytes: number, mode: 'readable' | 'data'): Promise<ReadBodyResult> {
  return new Promise((resolve) => {
    const read: BodyReading<Readable> = {
      stream,
      maxBytes,
      chunks: [],
      size: 0,
      resolve,
      onReadable: undefined,
      onData: undefined,
      onEnd: undefined,
      onError: undefined,
    };
    read.onEnd = endOfBody.bind(read);
    read.onError = unreadableBody.bind(read);
    if (mode === 'readable') {
      read.onReadable = readAvailable.bind(read as BodyReading<IncomingMessage>);
      stream.on('readable', read.onReadable);
    } else {
      read.onData = streamData.bind(read);
      stream.on('data', read.onData);
    }
    stream.on('error', read.onError);
    stream.on('end', read.onEnd);
  });
}

function streamData(this: BodyReading<Readable>, chunk: Buffer | string) {
  const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
  this.size += bytes.length;
  if (this.size > this.maxBytes) {
    // Not destroyed: on a request, that would kill the socket before the 413 is written. The
    // rest of the body is drained and dropped instead.
    bodyRead(this, { ok: false, error: tooLarge(this.maxBytes) });
    this.stream.resume();
    return;
  }
  this.chunks.push(bytes);
}
