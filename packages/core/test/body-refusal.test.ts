import { Buffer } from 'node:buffer';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { type RequestBodyFacts, refusesRequestBody } from '../src/body-refusal.js';
import { decodeRequestBody } from '../src/http-body.js';

const request = (body: string | Buffer | undefined, headers: Record<string, string> = {}): RequestBodyFacts => ({
  headers: { 'content-type': 'application/json', ...headers },
  body: typeof body === 'string' ? Buffer.from(body) : body,
});
const refusal = (fields: Record<string, unknown>) => Object.assign(new Error('refused'), { status: 400, ...fields });

describe("refusesRequestBody: a parser's refusal is about this request's body", () => {
  it('the text a parser could not parse must be the body, decoded as the parsers decode it', () => {
    const sent = request('{"amount":');
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: '{"amount":' }), sent)).toBe(true);
    expect(refusesRequestBody(refusal({ body: '{"amount":' }), sent)).toBe(true);
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: '<html>' }), sent)).toBe(false);
    expect(refusesRequestBody(refusal({ body: '{"amount":1' }), sent)).toBe(false);
    // The charset of Content-Type (body-parser), and a BOM dropped, as iconv-lite and TextDecoder both do.
    const latin1 = request(Buffer.from([0x7b, 0xe9]), { 'content-type': 'text/plain; charset="ISO-8859-1"' });
    expect(refusesRequestBody(refusal({ body: '{é' }), latin1)).toBe(true);
    // co-body reads every body as UTF-8, whatever its charset: its copy of the same bytes.
    expect(refusesRequestBody(refusal({ body: '{\ufffd' }), latin1)).toBe(true);
    expect(refusesRequestBody(refusal({ body: '{e' }), latin1)).toBe(false);
    const bom = request(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{')]));
    expect(refusesRequestBody(refusal({ body: '{' }), bom)).toBe(true);
    // A charset this runtime cannot decode proves nothing by itself; the UTF-8 reading still may
    // (co-body's), and nothing else does.
    const unknown = request(Buffer.from([0x7b, 0xe9]), { 'content-type': 'application/json; charset=x-unknown' });
    expect(refusesRequestBody(refusal({ body: '{é' }), unknown)).toBe(false);
    expect(refusesRequestBody(refusal({ body: '{\ufffd' }), unknown)).toBe(true);
  });

  it('the bytes a verify hook refused must be the body; no body read means no match', () => {
    const sent = request('{"note":"forged"}');
    const verified = (body: unknown) => refusal({ status: 403, type: 'entity.verify.failed', body });
    expect(refusesRequestBody(verified(Buffer.from('{"note":"forged"}')), sent)).toBe(true);
    expect(refusesRequestBody(verified(new Uint8Array(Buffer.from('{"note":"forged"}'))), sent)).toBe(true);
    expect(refusesRequestBody(verified(Buffer.from('{"note":"other"}')), sent)).toBe(false);
    expect(refusesRequestBody(verified(42), sent)).toBe(false);
    expect(refusesRequestBody(refusal({ body: '{}' }), request(undefined))).toBe(false);
  });

  it('too large: the limit must be below the body, and a declared length must be its Content-Length', () => {
    const sent = request('x'.repeat(100), { 'content-length': '100' });
    const tooLarge = (fields: Record<string, unknown>) => refusal({ status: 413, type: 'entity.too.large', ...fields });
    expect(refusesRequestBody(tooLarge({ expected: 100, length: 100, limit: 50 }), sent)).toBe(true);
    // raw-body's streamed check (no length given): what it received, past the limit.
    expect(refusesRequestBody(tooLarge({ limit: 50, received: 51 }), sent)).toBe(true);
    expect(refusesRequestBody(tooLarge({ expected: 5_000_000, length: 5_000_000, limit: 50 }), sent)).toBe(false);
    expect(refusesRequestBody(tooLarge({ limit: 100, received: 101 }), sent)).toBe(false);
    expect(refusesRequestBody(tooLarge({ limit: 50 }), request(undefined))).toBe(false);
  });

  it('the charset and coding not supported must be the ones the request named', () => {
    const sent = request('{}', {
      'content-type': 'application/json; charset=latin1',
      'content-encoding': ' Compress ',
    });
    expect(refusesRequestBody(refusal({ status: 415, type: 'charset.unsupported', charset: 'latin1' }), sent)).toBe(
      true,
    );
    expect(refusesRequestBody(refusal({ status: 415, type: 'charset.unsupported', charset: 'utf-7' }), sent)).toBe(
      false,
    );
    expect(refusesRequestBody(refusal({ status: 415, type: 'encoding.unsupported', encoding: 'compress' }), sent)).toBe(
      true,
    );
    // raw-body's own encoding.unsupported names the charset it was asked to decode with.
    expect(refusesRequestBody(refusal({ status: 415, type: 'encoding.unsupported', encoding: 'LATIN1' }), sent)).toBe(
      true,
    );
    expect(refusesRequestBody(refusal({ status: 415, type: 'encoding.unsupported', encoding: 'zstd' }), sent)).toBe(
      false,
    );
  });

  it('a body cut short is never the one begin read whole', () => {
    const sent = request('{}');
    expect(refusesRequestBody(refusal({ type: 'request.aborted', received: 1 }), sent)).toBe(false);
    expect(refusesRequestBody(refusal({ type: 'request.size.invalid', expected: 2, received: 1 }), sent)).toBe(false);
    // Nor one a parser that ran first read whole, before the key was claimed.
    expect(refusesRequestBody(refusal({ type: 'request.aborted' }), request(undefined))).toBe(false);
  });

  it('an error that says nothing of what it read is taken on its word, and without facts nothing is checked', () => {
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed' }), request('{}'))).toBe(true);
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: '<html>' }), undefined)).toBe(true);
  });
});

// Was wrong: a parser that does not decode Content-Encoding (Fastify's own, a parser of one's own,
// the Koa table's) refuses the gzip bytes themselves, and its error carries them as text. They were
// compared with the decoded body only, so the refusal was taken for the handler's outcome: stored,
// and the key's plain retry replayed a 400 no handler wrote.
describe('a parser that refuses a compressed body as it came', () => {
  it('its copy of the encoded bytes is this request body; any other text is not', () => {
    const sent = gzipSync('{"amount":100}');
    const read = decodeRequestBody(sent, 'gzip', 1_048_576);
    if (!read.ok) throw new Error('the body decodes');
    const facts = request(read.body, { 'content-encoding': 'gzip' });
    expect(refusesRequestBody(refusal({ body: sent.toString('utf8') }), facts)).toBe(true);
    expect(refusesRequestBody(refusal({ type: 'entity.parse.failed', body: sent.toString('utf8') }), facts)).toBe(true);
    expect(refusesRequestBody(refusal({ body: gzipSync('{"amount":1}').toString('utf8') }), facts)).toBe(false);
    // Sent plain, the body has no other spelling.
    expect(refusesRequestBody(refusal({ body: sent.toString('utf8') }), request('{"amount":100}'))).toBe(false);
  });
});
