import type { IncomingMessage } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
import type { Readable } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { WebhookError } from './errors.js';

/**
 * Default largest webhook body, after decompression: 1 MiB.
 *
 * @example
 * expressWebhook(receiver, { limit: defaultBodyLimit / 4 }); // 256 KiB
 */
export const defaultBodyLimit = 1024 * 1024;

/** Options of {@link readRawBody}. */
export interface RawBodyOptions {
  /** Largest body in bytes, after decompression. Default 1 MiB. */
  limit?: number | undefined;
}

/**
 * The glue's body limit in bytes: `limit`, or the default when it is undefined. Anything else that
 * is not a non-negative integer throws a `TypeError`: compared against sizes, a string (`'1mb'`, as
 * body parsers take it) or NaN is never exceeded, and would switch the limit off.
 */
export function bodyLimitOf(limit: number | undefined): number {
  const resolved = limit ?? defaultBodyLimit;
  if (!Number.isSafeInteger(resolved) || resolved < 0)
    throw new TypeError('limit must be a non-negative integer number of bytes');
  return resolved;
}

/** The `body_too_large` error for a body over `limit` bytes. */
export const bodyTooLarge = (limit: number): WebhookError =>
  new WebhookError('body_too_large', `The webhook body is larger than ${limit} bytes.`, { details: { limit } });

const alreadyRead = () =>
  new WebhookError(
    'raw_body_required',
    'The request body stream was already read by another middleware (a body parser), so its exact bytes are gone. ' +
      'Register the webhook route before any body parser, or scope the parsers away from it.',
    { details: { received: 'consumed stream' } },
  );

function decoderFor(encoding: string | undefined): (() => NodeJS.ReadWriteStream) | undefined | false {
  const value = (encoding ?? '').trim().toLowerCase();
  if (value === '' || value === 'identity') return undefined;
  if (value === 'gzip' || value === 'x-gzip') return createGunzip;
  if (value === 'deflate') return createInflate;
  if (value === 'br') return createBrotliDecompress;
  return false;
}

async function collect(stream: AsyncIterable<Buffer | string>, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of stream) {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
    size += bytes.length;
    // Checked while reading, so a compressed bomb or an endless stream stops at the limit.
    if (size > limit) throw bodyTooLarge(limit);
    chunks.push(bytes);
  }
  return Buffer.concat(chunks, size);
}

/**
 * Reads a request's exact body bytes, decompressing a `Content-Encoding` of gzip, deflate or br
 * (a signature covers the payload, not its transfer compression), under a size limit. Node's HTTP/1
 * and HTTP/2 requests alike (`http.createServer`, `http2.createServer`, `request.raw` of Fastify).
 *
 * Fails closed: a stream another middleware already read throws `raw_body_required`; an unknown
 * encoding throws `body_encoding_unsupported`; too many bytes throw `body_too_large`; a body the
 * connection ended before it was whole throws `body_incomplete`.
 *
 * @example
 * const body = await readRawBody(req, { limit: 256 * 1024 });
 * const response = await receiver.handle({ headers: req.headers, body });
 */
export async function readRawBody(
  request: IncomingMessage | Http2ServerRequest,
  options: RawBodyOptions = {},
): Promise<Buffer> {
  const limit = bodyLimitOf(options.limit);
  if (request.readableDidRead || request.readableEnded) throw alreadyRead();
  return readBodyStream(request, request.headers['content-encoding'], request.headers['content-length'], limit);
}

/**
 * Reads a body stream under `limit` (counted after decoding, checked while reading), decoding gzip,
 * deflate or br. Shared by the Node glue and the fetch glue (over `Readable.fromWeb`), so both stop
 * at the limit instead of buffering whatever arrives.
 */
export async function readBodyStream(
  source: Readable,
  encoding: string | undefined,
  declaredLength: string | null | undefined,
  limit: number,
): Promise<Buffer> {
  const declared = Number(declaredLength ?? Number.NaN);
  const decoder = decoderFor(encoding);
  if (decoder === false) {
    source.resume();
    throw new WebhookError(
      'body_encoding_unsupported',
      'The webhook body uses a Content-Encoding other than gzip, deflate or br.',
      {
        details: { encoding: String(encoding).slice(0, 32) },
      },
    );
  }
  if (decoder === undefined && Number.isFinite(declared) && declared > limit) {
    source.resume();
    throw bodyTooLarge(limit);
  }
  if (decoder === undefined) {
    try {
      return await collect(source, limit);
    } catch (error) {
      if (error instanceof WebhookError) throw error;
      throw cutShort(error);
    }
  }
  return decodeStream(source, decoder(), limit);
}

/**
 * The sender hung up (or the stream failed) before the whole body arrived. Node's error for that is
 * `aborted` with code ECONNRESET, the code a lost database connection carries too: passed on as it
 * is, an app's error handler that answers database failures 503 took a sender's hang-up for its own
 * database going down. A WebhookError of its own, the glue answers it (to nobody, most often).
 */
const cutShort = (cause: unknown): WebhookError =>
  new WebhookError('body_incomplete', 'The connection ended before the whole webhook body arrived.', { cause });

async function decodeStream(source: Readable, decoder: NodeJS.ReadWriteStream, limit: number): Promise<Buffer> {
  // pipe() passes on neither an error nor an aborted connection: the decoder would wait forever for
  // the rest of the body, holding the request. Both end it here, with the source's own error.
  let broken: unknown;
  const fail = (error: unknown) => {
    broken = error;
    (decoder as unknown as Readable).destroy(error as Error);
  };
  const onError = (error: unknown) => fail(error);
  const onClose = () => {
    if (!source.readableEnded) fail(new Error('the connection closed before the whole webhook body arrived'));
  };
  source.once('error', onError);
  source.once('close', onClose);
  source.pipe(decoder as unknown as NodeJS.WritableStream);
  try {
    return await collect(decoder as unknown as AsyncIterable<Buffer>, limit);
  } catch (error) {
    source.unpipe();
    source.resume();
    if (broken !== undefined) throw cutShort(broken);
    if (error instanceof WebhookError) throw error;
    throw new WebhookError('body_encoding_unsupported', 'The webhook body could not be decompressed.', {
      cause: error,
    });
  } finally {
    source.removeListener('error', onError);
    source.removeListener('close', onClose);
  }
}

/**
 * Decompresses bytes a framework read without decoding them (Fastify's buffer parser keeps the
 * `Content-Encoding`), under the same limit. Identity bodies come back as they are.
 *
 * @example
 * const body = await decodeBody(request.body as Buffer, request.headers['content-encoding']);
 */
export async function decodeBody(
  body: Buffer,
  encoding: string | undefined,
  options: RawBodyOptions = {},
): Promise<Buffer> {
  const limit = bodyLimitOf(options.limit);
  const decoder = decoderFor(encoding);
  if (decoder === undefined) {
    if (body.length > limit) throw bodyTooLarge(limit);
    return body;
  }
  if (decoder === false) {
    throw new WebhookError(
      'body_encoding_unsupported',
      'The webhook body uses a Content-Encoding other than gzip, deflate or br.',
      {
        details: { encoding: String(encoding).slice(0, 32) },
      },
    );
  }
  const stream = decoder();
  const done = collect(stream as unknown as AsyncIterable<Buffer>, limit);
  stream.end(body);
  try {
    return await done;
  } catch (error) {
    if (error instanceof WebhookError) throw error;
    throw new WebhookError('body_encoding_unsupported', 'The webhook body could not be decompressed.', {
      cause: error,
    });
  }
}
