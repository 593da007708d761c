import { Buffer } from 'node:buffer';
import type { IncomingHttpHeaders } from 'node:http';
import { boundaryParameterOf, malformedPartHeader } from './multipart.js';

/** What the capture knows of the request whose body a parser may refuse (see {@link refusesRequestBody}). */
export interface RequestBodyFacts {
  /** The request's headers (`Content-Type`, `Content-Length`, `Content-Encoding` are read). */
  headers: IncomingHttpHeaders;
  /** The body as `begin` read it, decoded from its `Content-Encoding`; undefined when it never read one. */
  body: Uint8Array | undefined;
}

// The `type` of the errors body-parser (Express's parsers) and raw-body (under it, and under
// co-body) raise when they refuse a body: malformed, too large, in a charset or coding they do not
// take, cut short, refused by a `verify` hook, or with too many parameters.
const bodyRefusalTypes: ReadonlySet<string> = new Set([
  'entity.parse.failed',
  'entity.verify.failed',
  'entity.too.large',
  'encoding.unsupported',
  'charset.unsupported',
  'request.aborted',
  'request.size.invalid',
  'stream.encoding.set',
  'stream.not.readable',
  'parameters.too.many',
  'querystring.parse.rangeError',
]);

// Bodies `begin` could not decode from their `Content-Encoding`: kept as they came, and fingerprinted
// so. A parser that decodes them meets the same error. Only such bodies enter (a rare failure path),
// so a weak set costs the request path nothing.
const undecodable = new WeakSet<Uint8Array>();

/**
 * Marks `body` as bytes that did not decode from the request's `Content-Encoding`: a decoder's 400
 * (see {@link isBodyRefusal}) is a refusal of this body only when it is so marked.
 *
 * @example
 * markUndecodable(raw); // gunzip of raw threw Z_DATA_ERROR
 */
export function markUndecodable(body: Uint8Array): void {
  undecodable.add(body);
}

// Bodies `begin` decoded from their `Content-Encoding`, each to the bytes as they came. A parser that
// does not decode (Fastify's own, one of the app's) refuses those bytes, and its error carries them:
// that is a refusal of this request as much as one of the decoded text.
const encodedOf = new WeakMap<Uint8Array, Uint8Array>();

/**
 * Records that `body` was decoded from `encoded` (the request's bytes as sent), so a parser's refusal
 * of the encoded bytes is known for this request's (see {@link refusesRequestBody}).
 *
 * @example
 * markDecoded(gunzipSync(raw), raw);
 */
export function markDecoded(body: Uint8Array, encoded: Uint8Array): void {
  if (body !== encoded) encodedOf.set(body, encoded);
}

// The codes Node's decoders give their errors: zlib's (`Z_DATA_ERROR`, `Z_BUF_ERROR` for a body cut
// short), brotli's (`ERR__ERROR_FORMAT_PADDING_1` and kin) and zstd's (`ZSTD_error_prefix_unknown`).
// body-parser passes them on as 400 with the code kept and no `type`.
const decoderErrorCode = /^(?:Z_[A-Z_]+|ERR__ERROR_[A-Z0-9_]+|ZSTD_error_\w+)$/;

function isDecoderError(error: object): boolean {
  const { code } = error as { code?: unknown };
  return typeof code === 'string' && decoderErrorCode.test(code);
}

// What inflation (under co-body) throws for a coding it does not take: status 415, no `type`.
const unsupportedCoding = /^Unsupported Content-Encoding: (.*)$/;

// The multipart parsers' refusals, which carry no status the frameworks read (they answer 500):
// formidable's (koa-body's multipart) FormidableError, a numeric internal `code` and the status in
// `httpCode`; multer's MulterError, named so, with a string `code` such as `LIMIT_FILE_SIZE` (but
// not `STREAM_DESTROYED`, a file stream torn down, not a refusal of the body).
function isMultipartRefusal(error: object): boolean {
  const { code, httpCode, name } = error as { code?: unknown; httpCode?: unknown; name?: unknown };
  if (name === 'MulterError') return typeof code === 'string' && code !== 'STREAM_DESTROYED';
  return typeof code === 'number' && typeof httpCode === 'number' && httpCode >= 400 && httpCode <= 499;
}

// The codes of @fastify/multipart's refusals of an upload (FastifyErrors with their 4xx in
// `statusCode`): a limit over (`limits.fileSize`, `files`, `fields`, `parts`), a field named after a
// prototype property, a field sent as JSON that does not parse (or was cut at `fieldSize`). Not its
// `FST_MP_PREMATURE_CLOSE` (the client left; the key is claimed only once the body is in whole, so it
// is never this request's refusal, as raw-body's `request.aborted`), nor its 500s
// (`FST_FILE_BUFFER_NOT_FOUND`, `FST_NO_FORM_DATA`: the server's set-up, not the body).
const fastifyMultipartCodes: ReadonlySet<string> = new Set([
  'FST_REQ_FILE_TOO_LARGE',
  'FST_FILES_LIMIT',
  'FST_FIELDS_LIMIT',
  'FST_PARTS_LIMIT',
  'FST_PROTO_VIOLATION',
  'FST_INVALID_JSON_FIELD_ERROR',
]);

// @fastify/multipart's refusal of a request that is no multipart/form-data at all, where the handler
// asks for its upload (`request.file()`, `request.parts()`).
const notMultipartCode = 'FST_INVALID_MULTIPART_CONTENT_TYPE';

function isFastifyMultipartRefusal(error: object): boolean {
  const { code, name } = error as { code?: unknown; name?: unknown };
  return (
    name === 'FastifyError' &&
    typeof code === 'string' &&
    (fastifyMultipartCodes.has(code) || code === notMultipartCode)
  );
}

// What busboy throws for a malformed body, with no code and no status (Fastify and Express answer
// 500): no boundary in `Content-Type`, a body that ends before its closing delimiter (cut short,
// or under another boundary), whole or in the file part it was writing, or (busboy 1, under multer)
// a part whose header section does not parse. busboy 1 words the end "Unexpected end of form"; the
// version under @fastify/multipart, as the others.
const noBoundary = 'Multipart: Boundary not found';
const badPartHeader = 'Malformed part header';
const unexpectedEnd =
  /^(?:Unexpected end of (?:multipart data|form)|\w+ terminated early due to unexpected end of multipart data)$/;

function isBusboyRefusal(error: object): boolean {
  if (!(error instanceof Error) || (error as { code?: unknown }).code !== undefined) return false;
  return error.message === noBoundary || error.message === badPartHeader || unexpectedEnd.test(error.message);
}

/**
 * True when `error` has the shape of a body parser's refusal: a 4xx error of body-parser or
 * raw-body with their `type`, co-body's untyped parse error (status 400, the text in `body`), a
 * decoder's error (a body that does not inflate from its `Content-Encoding`: given status 400 by
 * body-parser, passed on bare by co-body, which Koa then answers 500), inflation's 415 for a coding
 * it does not take, or a multipart parser's (formidable's 4xx `httpCode`, multer's `MulterError`,
 * which carry no status the frameworks read, so they answer 500; @fastify/multipart's FastifyErrors
 * for an upload over its limits or one that is no multipart, with their 4xx `statusCode`; busboy's
 * error for a body with no boundary, cut short, or with a part header that does not parse, which
 * Fastify and Express answer 500).
 *
 * @example
 * isBodyRefusal(Object.assign(new Error('Unexpected token'), { status: 400, type: 'entity.parse.failed' })); // true
 */
export function isBodyRefusal(error: unknown): boolean {
  if (error === null || typeof error !== 'object') return false;
  const { status, statusCode, type } = error as { status?: unknown; statusCode?: unknown; type?: unknown };
  const code = typeof status === 'number' ? status : statusCode;
  if (code === undefined && type === undefined && (isDecoderError(error) || isMultipartRefusal(error))) return true;
  if (code === undefined && type === undefined && isBusboyRefusal(error)) return true;
  if (isFastifyMultipartRefusal(error)) return typeof code === 'number' && code >= 400 && code <= 499;
  if (typeof code !== 'number' || code < 400 || code > 499) return false;
  if (typeof type === 'string') return bodyRefusalTypes.has(type);
  if (code === 400 && isDecoderError(error)) return true;
  if (code === 415 && error instanceof Error && unsupportedCoding.test(error.message)) return true;
  // co-body's JSON and form errors carry no `type`: the parser's own error, given status 400 and
  // the text it could not parse as `body`.
  return code === 400 && error instanceof Error && typeof (error as { body?: unknown }).body === 'string';
}

/**
 * True when a refusal-shaped error (see {@link isBodyRefusal}) is about this request's body, as far
 * as the error tells. The shape alone is not enough: raw-body raises the same errors for any stream,
 * so a handler that has done its work and then reads an upstream answer with it (or with co-body)
 * throws `entity.too.large` or `request.aborted` too. Taken for a refusal, that error would release
 * the key of an operation that ran, and the retry would run it again. What the parsers put on their
 * errors is checked against the request:
 * - `body` (the text or bytes a parser could not parse or verify) must be the request's body,
 *   decoded or (for a parser that does not decode `Content-Encoding`) as sent;
 * - `limit` (too large) must be below the body's size, and `expected` must be its `Content-Length`;
 * - `charset` and `encoding` (not supported) must be the request's;
 * - `request.aborted` and `request.size.invalid` are never this request's: the key is claimed only
 *   once the body is in whole (`begin` read it, or a parser that ran first did), so no parser
 *   reading it afterwards can see it cut short;
 * - a decoder's error is this request's only when `begin` could not decode its body either
 *   ({@link markUndecodable}): one that decoded there decodes for the parser too;
 * - inflation's unsupported coding must be the request's `Content-Encoding`, as sent;
 * - formidable's, multer's and @fastify/multipart's refusals are of a multipart request (they parse
 *   request bodies only); @fastify/multipart's `FST_INVALID_MULTIPART_CONTENT_TYPE`, of a request
 *   that is none;
 * - busboy's are of a multipart request whose `Content-Type` has no boundary, or whose body has no
 *   closing delimiter of the boundary it names, or a part header that does not parse
 *   ({@link malformedPartHeader}).
 * An error that carries none of these (a parser of one's own that opts in with a `type`) is taken
 * on its word. Without facts (a capture made with no `request`), nothing is checked.
 *
 * @example
 * refusesRequestBody(error, { headers: req.headers, body: started.body });
 */
export function refusesRequestBody(error: object, request: RequestBodyFacts | undefined): boolean {
  if (request === undefined) return true;
  const told = error as {
    type?: unknown;
    body?: unknown;
    limit?: unknown;
    expected?: unknown;
    charset?: unknown;
    encoding?: unknown;
  };
  const { body } = request;
  if (told.type === 'request.aborted' || told.type === 'request.size.invalid') return false;
  if (told.type === undefined && isDecoderError(error)) return body !== undefined && undecodable.has(body);
  // formidable and multer parse request bodies only, never another service's answer: a multipart
  // request's.
  const multipart = /^multipart\//i.test(String(request.headers['content-type'] ?? '').trim());
  if (told.type === undefined && isMultipartRefusal(error)) return multipart;
  // @fastify/multipart's refusals are raised where the handler reads this request's upload (or, with
  // `attachFieldsToBody`, before the key is claimed): a multipart request's, and its refusal of a
  // request that is none, that request's.
  if (isFastifyMultipartRefusal(error))
    return (error as { code?: unknown }).code === notMultipartCode ? !multipart : multipart;
  if (told.type === undefined && isBusboyRefusal(error)) return multipart && busboyMeets(error as Error, request);
  const coding = told.type === undefined && error instanceof Error ? unsupportedCoding.exec(error.message) : null;
  // inflation names the coding as the header gave it: it must be this request's, to the letter.
  if (coding !== null) return coding[1] === request.headers['content-encoding'];
  if (told.body !== undefined && !sameBody(told.body, request)) return false;
  if (typeof told.limit === 'number' && !(body !== undefined && body.length > told.limit)) return false;
  if (typeof told.expected === 'number' && told.expected !== declaredLength(request.headers)) return false;
  if (typeof told.charset === 'string' && told.charset.toLowerCase() !== charsetOf(request.headers)) return false;
  if (typeof told.encoding === 'string') {
    const encoding = told.encoding.trim().toLowerCase();
    const coding = String(request.headers['content-encoding'] ?? '')
      .trim()
      .toLowerCase();
    if (encoding !== coding && encoding !== charsetOf(request.headers)) return false;
  }
  return true;
}

// busboy's error is this request's when the request is what it says: a `Content-Type` without a
// boundary, a body (as `begin` read it) without the closing delimiter of the boundary it names, or
// with a part header that does not parse. A multipart answer of another service a handler parses
// after its work fails so on its own bytes, not on the request's.
function busboyMeets(error: Error, request: RequestBodyFacts): boolean {
  const contentType = request.headers['content-type'] ?? '';
  const boundary = boundaryParameterOf(contentType);
  if (error.message === noBoundary) return boundary === undefined;
  const body = request.body;
  if (boundary === undefined || boundary === '' || body === undefined) return false;
  if (error.message === badPartHeader) return malformedPartHeader(body, contentType);
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  return !bytes.includes(`--${boundary}--`);
}

// The parser's copy of the body: the bytes a `verify` hook refused, or the text it could not parse,
// decoded as the parsers decode it: body-parser by the charset of `Content-Type` (UTF-8 by
// default), co-body (under @koa/bodyparser) as UTF-8 whatever the charset says; a BOM dropped. A
// parser that does not decode `Content-Encoding` has the bytes as sent: those are this body too.
function sameBody(told: unknown, request: RequestBodyFacts): boolean {
  const body = request.body;
  if (body === undefined) return false;
  const encoded = encodedOf.get(body);
  return sameBytes(told, body, request) || (encoded !== undefined && sameBytes(told, encoded, request));
}

function sameBytes(told: unknown, body: Uint8Array, request: RequestBodyFacts): boolean {
  if (told instanceof Uint8Array) return Buffer.from(told.buffer, told.byteOffset, told.byteLength).equals(body);
  if (typeof told !== 'string') return false;
  const charset = charsetOf(request.headers) ?? 'utf-8';
  if (told === decoded(body, charset)) return true;
  return charset !== 'utf-8' && charset !== 'utf8' && told === decoded(body, 'utf-8');
}

// `body` as text in `charset`, or undefined for a charset this runtime cannot decode (no proof the
// parser read this body).
function decoded(body: Uint8Array, charset: string): string | undefined {
  try {
    return new TextDecoder(charset).decode(body);
  } catch {
    return undefined;
  }
}

function declaredLength(headers: IncomingHttpHeaders): number | undefined {
  const value = headers['content-length'];
  return value === undefined ? undefined : Number(value);
}

// The `charset` parameter of `Content-Type`, lower case and unquoted, or undefined.
function charsetOf(headers: IncomingHttpHeaders): string | undefined {
  const match = /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(headers['content-type'] ?? '');
  return match?.[1]?.toLowerCase();
}
