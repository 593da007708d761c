import { Buffer } from 'node:buffer';
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { gunzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { isBodyRefusal, markUndecodable, type RequestBodyFacts, refusesRequestBody } from '../src/body-refusal.js';
import { readBodyForFingerprint } from '../src/http-body.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';

// Cases the first tests of refusesRequestBody left open: each one tells a refusal of the request's
// own body from an error that only looks like one (a handler reading another service's answer).

const request = (body: string | Buffer | undefined, headers: Record<string, string> = {}): RequestBodyFacts => ({
  headers: { 'content-type': 'application/json', ...headers },
  body: typeof body === 'string' ? Buffer.from(body) : body,
});
const refusal = (fields: Record<string, unknown>) => Object.assign(new Error('refused'), { status: 400, ...fields });

describe("refusesRequestBody: what a parser says must match the request's body exactly", () => {
  it("a body cut short is never this request's, even when the length it expected is the request's own", () => {
    // raw-body's request.size.invalid names the length it expected: an upstream answer of the same
    // declared length as the request must still not release the key of an operation that ran.
    const sent = request('{"amount":1}', { 'content-length': '12' });
    const cut = refusal({ type: 'request.size.invalid', expected: 12, length: 12, received: 5 });
    expect(refusesRequestBody(cut, sent)).toBe(false);
  });

  it('the length a too-large refusal expected must be the Content-Length, not merely below or above it', () => {
    const sent = request('x'.repeat(100), { 'content-length': '100' });
    const tooLarge = (expected: number) =>
      refusal({ status: 413, type: 'entity.too.large', expected, length: expected, limit: 50 });
    expect(refusesRequestBody(tooLarge(100), sent)).toBe(true);
    // An upstream answer of 60 bytes over a limit of 50, while the request (100 bytes) is larger too.
    expect(refusesRequestBody(tooLarge(60), sent)).toBe(false);
    expect(refusesRequestBody(tooLarge(101), sent)).toBe(false);
  });

  it('the bytes a verify hook refused must be the body, not bytes of the same length', () => {
    const sent = request('{"note":"forged"}');
    const verified = (body: Buffer) => refusal({ status: 403, type: 'entity.verify.failed', body });
    expect(refusesRequestBody(verified(Buffer.from('{"note":"forged"}')), sent)).toBe(true);
    expect(refusesRequestBody(verified(Buffer.from('{"note":"faked!"}')), sent)).toBe(false);
  });

  it('the text a parser could not parse must be the whole body, not a part of it', () => {
    const sent = request('{"amount":1,"note":');
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: '{"amount":1,"note":' }), sent)).toBe(true);
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: '{"amount":1' }), sent)).toBe(false);
    expect(refusesRequestBody(refusal({ body: '{' }), sent)).toBe(false);
  });

  it('charset names are compared in any case, in the error and in Content-Type, its parameter name too', () => {
    const unsupported = (charset: string) => refusal({ status: 415, type: 'charset.unsupported', charset });
    // A parser of one's own may name the charset as sent; body-parser lower-cases it.
    expect(
      refusesRequestBody(unsupported('LATIN1'), request('{}', { 'content-type': 'application/json; charset=latin1' })),
    ).toBe(true);
    // The client may write the charset, and the parameter's name, in upper case (RFC 9110 8.3.2).
    expect(
      refusesRequestBody(unsupported('latin1'), request('{}', { 'content-type': 'application/json; charset=LATIN1' })),
    ).toBe(true);
    expect(
      refusesRequestBody(unsupported('latin1'), request('{}', { 'content-type': 'application/json; Charset=latin1' })),
    ).toBe(true);
    expect(
      refusesRequestBody(unsupported('utf-7'), request('{}', { 'content-type': 'application/json; Charset=latin1' })),
    ).toBe(false);
  });

  it("a coding named with the spaces and case of the header is the request's coding", () => {
    // body-parser copies Content-Encoding lower-cased but not trimmed; a header set by hand (or by a
    // test client) may carry spaces around it.
    const sent = request('{}', { 'content-encoding': ' Compress ' });
    const unsupported = (encoding: string) => refusal({ status: 415, type: 'encoding.unsupported', encoding });
    expect(refusesRequestBody(unsupported(' compress '), sent)).toBe(true);
    expect(refusesRequestBody(unsupported(' zstd '), sent)).toBe(false);
  });
});

describe('capture.failedWith: a body that does not decode from its Content-Encoding', () => {
  const failedWith = (error: unknown, request: RequestBodyFacts) => {
    const http = createHttpIdempotency({ store: memoryStore() });
    const res = new ServerResponse(new IncomingMessage(new Socket()));
    return http.capture(res, { request }).failedWith(error);
  };

  // Bytes sent as gzip that are no gzip: `begin` cannot decode them and fingerprints them as they
  // came, and body-parser refuses the body with the decoder's error, given status 400 and no `type`
  // or `body`. Stored, that 400 would answer the fixed retry with 422 for the whole retention.
  const decoderRefusal = (bytes: Buffer) => {
    try {
      gunzipSync(bytes);
    } catch (error) {
      // What body-parser 2 hands to next(): createError(400, zlibError), then createError(400, that).
      return Object.assign(error as Error, { expose: true, status: 400, statusCode: 400 });
    }
    throw new Error('the bytes inflated');
  };

  it("body-parser's refusal of gzip bytes that do not inflate releases the key", async () => {
    const bytes = Buffer.from('{"amount":1} not gzip');
    const refused = decoderRefusal(bytes);
    expect((refused as { code?: string }).code).toBe('Z_DATA_ERROR');
    // The body as begin reads it: left as it came, and marked as not decoding.
    const stream = new IncomingMessage(new Socket());
    const length = String(bytes.length);
    stream.headers = { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': length };
    stream.push(bytes);
    stream.push(null);
    const read = await readBodyForFingerprint(stream, 1_000, {});
    expect(read.ok && read.body).toEqual(bytes);
    expect(failedWith(refused, { headers: stream.headers, body: read.ok ? read.body : undefined })).toBe(true);
  });

  it("a decoder's 400 over a body that begin decoded is a handler's own error: the key is kept", () => {
    // A handler that inflates an upstream answer and lets the error out, after its work: the
    // request's body decoded at begin, so no parser of it can have failed to decode it.
    const refused = decoderRefusal(Buffer.from('upstream bytes'));
    expect(failedWith(refused, request('{"amount":1}', { 'content-encoding': 'gzip' }))).toBe(false);
    expect(failedWith(refused, request('{"amount":1}'))).toBe(false);
    // Without facts of the request nothing is checked, as for every refusal shape.
    expect(refusesRequestBody(refused, undefined)).toBe(true);
  });
});

describe("co-body's refusals of a body's coding (inflation and zlib under it)", () => {
  it('a bare decoder error (no status: Koa answers 500) is a refusal of a body begin could not decode, only', () => {
    const bare = (code: string) => Object.assign(new Error('incorrect header check'), { code, errno: -3 });
    expect(isBodyRefusal(bare('Z_DATA_ERROR'))).toBe(true);
    expect(isBodyRefusal(bare('ZSTD_error_prefix_unknown'))).toBe(true);
    expect(isBodyRefusal(bare('ERR__ERROR_FORMAT_PADDING_1'))).toBe(true);
    // Any other bare error is a handler's.
    expect(isBodyRefusal(bare('ECONNRESET'))).toBe(false);
    expect(isBodyRefusal(Object.assign(bare('Z_DATA_ERROR'), { type: 'custom' }))).toBe(false);
    const marked = Buffer.from('{"amount":1} not gzip');
    markUndecodable(marked);
    const gzipped = { 'content-type': 'application/json', 'content-encoding': 'gzip' };
    expect(refusesRequestBody(bare('Z_DATA_ERROR'), { headers: gzipped, body: marked })).toBe(true);
    expect(refusesRequestBody(bare('Z_DATA_ERROR'), request('{"amount":1}', { 'content-encoding': 'gzip' }))).toBe(
      false,
    );
  });

  it("inflation's 415 names a coding: a refusal only when it is the request's Content-Encoding, as sent", () => {
    const unsupported = (coding: string) =>
      Object.assign(new Error(`Unsupported Content-Encoding: ${coding}`), { status: 415 });
    expect(isBodyRefusal(unsupported('compress'))).toBe(true);
    expect(isBodyRefusal(Object.assign(new Error('Unsupported Media Type'), { status: 415 }))).toBe(false);
    const sent = request('{}', { 'content-encoding': 'compress' });
    expect(refusesRequestBody(unsupported('compress'), sent)).toBe(true);
    expect(refusesRequestBody(unsupported('x-compress'), sent)).toBe(false);
    // Another service's answer in a coding the handler's reader does not take: not this request's.
    expect(refusesRequestBody(unsupported('compress'), request('{}'))).toBe(false);
  });
});

describe("formidable's refusals (koa-body's multipart)", () => {
  const formidable = (httpCode: number) =>
    Object.assign(new Error('options.maxFileSize (100 bytes) exceeded'), { code: 1009, httpCode });

  it('a 4xx httpCode with a numeric code and no status is a refusal of a multipart request only', () => {
    expect(isBodyRefusal(formidable(413))).toBe(true);
    // Its "Request aborted" is a 500: no refusal.
    expect(isBodyRefusal(formidable(500))).toBe(false);
    expect(isBodyRefusal(Object.assign(formidable(413), { code: 'E413' }))).toBe(false);
    const multipart = request('--b--', { 'content-type': 'multipart/form-data; boundary=b' });
    expect(refusesRequestBody(formidable(413), multipart)).toBe(true);
    expect(refusesRequestBody(formidable(413), request('{"amount":1}'))).toBe(false);
  });
});

describe("multer's refusals (Express uploads)", () => {
  const multerError = (code: string) => Object.assign(new Error('File too large'), { name: 'MulterError', code });

  it('a MulterError is a refusal of a multipart request only; a torn-down file stream is none', () => {
    expect(isBodyRefusal(multerError('LIMIT_FILE_SIZE'))).toBe(true);
    expect(isBodyRefusal(multerError('STREAM_DESTROYED'))).toBe(false);
    expect(isBodyRefusal(Object.assign(new Error('File too large'), { code: 'LIMIT_FILE_SIZE' }))).toBe(false);
    const multipart = request('--b--', { 'content-type': 'multipart/form-data; boundary=b' });
    expect(refusesRequestBody(multerError('LIMIT_FILE_SIZE'), multipart)).toBe(true);
    expect(refusesRequestBody(multerError('LIMIT_FILE_SIZE'), request('{"amount":1}'))).toBe(false);
  });
});

describe("@fastify/multipart's refusals (Fastify uploads)", () => {
  // As @fastify/error builds them: name FastifyError, the code, the status in `statusCode`.
  const fastifyError = (code: string, statusCode: number) =>
    Object.assign(new Error('reach files limit'), { name: 'FastifyError', code, statusCode });
  const multipart = request('--b--', { 'content-type': 'multipart/form-data; boundary=b' });

  it('a limit over, a prototype field or a JSON field that does not parse: a refusal of a multipart request only', () => {
    for (const [code, status] of [
      ['FST_REQ_FILE_TOO_LARGE', 413],
      ['FST_FILES_LIMIT', 413],
      ['FST_FIELDS_LIMIT', 413],
      ['FST_PARTS_LIMIT', 413],
      ['FST_PROTO_VIOLATION', 400],
      ['FST_INVALID_JSON_FIELD_ERROR', 406],
    ] as const) {
      expect(isBodyRefusal(fastifyError(code, status)), code).toBe(true);
      expect(refusesRequestBody(fastifyError(code, status), multipart), code).toBe(true);
      expect(refusesRequestBody(fastifyError(code, status), request('{"amount":1}')), code).toBe(false);
    }
  });

  it('a request that is no multipart is refused so only when it is none', () => {
    const notMultipart = fastifyError('FST_INVALID_MULTIPART_CONTENT_TYPE', 406);
    expect(isBodyRefusal(notMultipart)).toBe(true);
    expect(refusesRequestBody(notMultipart, request('{"amount":1}'))).toBe(true);
    expect(refusesRequestBody(notMultipart, request(undefined, { 'content-type': '' }))).toBe(true);
    expect(refusesRequestBody(notMultipart, multipart)).toBe(false);
  });

  it('a client gone, a server set-up at fault, a look-alike of another name or a 5xx: no refusal', () => {
    // The key is claimed once the body is in whole: a premature close is never this request's refusal.
    expect(isBodyRefusal(fastifyError('FST_MP_PREMATURE_CLOSE', 400))).toBe(false);
    expect(isBodyRefusal(fastifyError('FST_FILE_BUFFER_NOT_FOUND', 500))).toBe(false);
    expect(isBodyRefusal(fastifyError('FST_NO_FORM_DATA', 500))).toBe(false);
    expect(isBodyRefusal(fastifyError('FST_FILES_LIMIT', 500))).toBe(false);
    expect(isBodyRefusal(fastifyError('FST_FILES_LIMIT', 399))).toBe(false);
    expect(isBodyRefusal(Object.assign(fastifyError('FST_FILES_LIMIT', 413), { name: 'Error' }))).toBe(false);
    expect(
      isBodyRefusal(Object.assign(fastifyError('FST_FILES_LIMIT', 413), { code: 'FST_ERR_CTP_BODY_TOO_LARGE' })),
    ).toBe(false);
  });
});

describe("busboy's errors for a malformed multipart body (under @fastify/multipart)", () => {
  const cutShort = () => new Error('Unexpected end of multipart data');
  const partCutShort = () => new Error('Part terminated early due to unexpected end of multipart data');
  const noBoundary = () => new Error('Multipart: Boundary not found');
  const whole = '--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n--b--\r\n';
  const upload = (body: string | undefined, type = 'multipart/form-data; boundary=b') =>
    request(body, { 'content-type': type });

  it('are refusal-shaped with no code and no status, and by their own words only', () => {
    expect(isBodyRefusal(cutShort())).toBe(true);
    expect(isBodyRefusal(partCutShort())).toBe(true);
    expect(isBodyRefusal(noBoundary())).toBe(true);
    expect(isBodyRefusal(Object.assign(cutShort(), { code: 'ECONNRESET' }))).toBe(false);
    expect(isBodyRefusal(Object.assign(cutShort(), { status: 502 }))).toBe(false);
    expect(isBodyRefusal(new Error('Unexpected end of multipart data, and more'))).toBe(false);
    // busboy 1's wording, under multer.
    expect(isBodyRefusal(new Error('Unexpected end of form'))).toBe(true);
    expect(isBodyRefusal(new Error('Unexpected end of formula'))).toBe(false);
    expect(isBodyRefusal({ message: 'Unexpected end of multipart data' })).toBe(false);
  });

  it("a body cut short is this request's when its body lacks the closing delimiter of its boundary", () => {
    const cut = whole.slice(0, 40);
    expect(refusesRequestBody(cutShort(), upload(cut))).toBe(true);
    expect(refusesRequestBody(partCutShort(), upload(cut))).toBe(true);
    expect(refusesRequestBody(new Error('Unexpected end of form'), upload(cut))).toBe(true);
    expect(refusesRequestBody(new Error('Unexpected end of form'), upload(whole))).toBe(false);
    // A body under another boundary than the one Content-Type names never ends for busboy.
    expect(refusesRequestBody(cutShort(), upload(whole.replaceAll('--b', '--c')))).toBe(true);
    // The boundary quoted, as RFC 2046 allows.
    expect(refusesRequestBody(cutShort(), upload(cut, 'multipart/form-data; boundary="b"'))).toBe(true);
    expect(refusesRequestBody(cutShort(), upload(whole, 'multipart/form-data; boundary="b"'))).toBe(false);
    // The request's own body is whole: the handler parsed something else.
    expect(refusesRequestBody(cutShort(), upload(whole))).toBe(false);
    expect(refusesRequestBody(partCutShort(), upload(whole))).toBe(false);
    // Nothing read to check it against, or no multipart request at all.
    expect(refusesRequestBody(cutShort(), upload(undefined))).toBe(false);
    expect(refusesRequestBody(cutShort(), request('{"amount":1}'))).toBe(false);
    expect(refusesRequestBody(cutShort(), upload(cut, 'multipart/form-data'))).toBe(false);
  });

  it("a malformed part header (busboy 1, under multer) is this request's when a part header of its body does not parse", () => {
    const malformed = () => new Error('Malformed part header');
    expect(isBodyRefusal(malformed())).toBe(true);
    expect(isBodyRefusal(Object.assign(malformed(), { code: 'ERR_X' }))).toBe(false);
    expect(isBodyRefusal(new Error('Malformed part headers'))).toBe(false);
    const bad = whole.replace('Content-Disposition:', 'Content-Disposition');
    expect(refusesRequestBody(malformed(), upload(bad))).toBe(true);
    // The request's own parts are well formed: the handler parsed something else.
    expect(refusesRequestBody(malformed(), upload(whole))).toBe(false);
    expect(refusesRequestBody(malformed(), upload(bad, 'multipart/form-data; boundary=c'))).toBe(false);
    expect(refusesRequestBody(malformed(), upload(undefined))).toBe(false);
    expect(refusesRequestBody(malformed(), upload(bad, 'multipart/form-data'))).toBe(false);
    expect(refusesRequestBody(malformed(), request(bad, { 'content-type': 'text/plain' }))).toBe(false);
  });

  it("no boundary is this request's when its Content-Type names none", () => {
    expect(refusesRequestBody(noBoundary(), upload(whole, 'multipart/form-data'))).toBe(true);
    // An empty boundary is one: busboy fails on it otherwise, never "not found".
    expect(refusesRequestBody(noBoundary(), upload(whole, 'multipart/form-data; boundary='))).toBe(false);
    expect(refusesRequestBody(cutShort(), upload(whole.slice(0, 40), 'multipart/form-data; boundary='))).toBe(false);
    expect(refusesRequestBody(noBoundary(), upload(whole))).toBe(false);
    expect(refusesRequestBody(noBoundary(), request('{"amount":1}'))).toBe(false);
  });
});
