import * as zlib from 'node:zlib';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { acceptsCoding, negotiatedBody } from '../src/content-coding.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';

describe('acceptsCoding: RFC 9110 Accept-Encoding', () => {
  it.each([
    [undefined, 'gzip', false],
    ['', 'gzip', false],
    ['identity', 'gzip', false],
    ['gzip', 'gzip', true],
    ['GZIP', 'gzip', true],
    ['x-gzip', 'gzip', true],
    ['gzip', 'x-gzip', true],
    ['deflate, gzip;q=0.5', 'gzip', true],
    ['gzip;q=0', 'gzip', false],
    ['gzip; q=0.000', 'gzip', false],
    ['gzip;q=nonsense', 'gzip', false],
    ['*', 'br', true],
    ['*;q=0', 'br', false],
    ['br;q=0, *', 'br', false],
    ['*, br;q=0', 'br', false],
    ['gzip;q=0, *;q=0.1', 'deflate', true],
    ['deflate', 'br', false],
  ])('%j takes %s: %s', (field, coding, expected) => {
    expect(acceptsCoding(field, coding)).toBe(expected);
  });
});

describe('negotiatedBody: a stored compressed body for a retry that does not take its coding', () => {
  const json = Buffer.from(JSON.stringify({ id: 'ch_1', pad: 'x'.repeat(200) }));

  const codings: Array<[string, Buffer]> = [
    ['gzip', gzipSync(json)],
    ['x-gzip', gzipSync(json)],
    ['deflate', deflateSync(json)],
    ['br', brotliCompressSync(json)],
  ];
  // zstd where the runtime has it (Node 22.15 and later).
  if (zlib.zstdCompressSync) codings.push(['zstd', zlib.zstdCompressSync(json)]);

  it.each(codings)('decodes %s, drops Content-Encoding and weakens a strong ETag', (coding, bytes) => {
    const headers = { 'content-type': 'application/json', 'content-encoding': coding, etag: '"v1"' };
    const out = negotiatedBody(headers, bytes, 'identity', 1 << 20);
    expect(out).toBeDefined();
    expect(Buffer.from(out?.body ?? []).equals(json)).toBe(true);
    expect(out?.headers).toEqual({ 'content-type': 'application/json', etag: 'W/"v1"' });
  });

  it('keeps a weak ETag as it is', () => {
    const out = negotiatedBody({ 'content-encoding': 'gzip', etag: 'W/"v1"' }, gzipSync(json), undefined, 1 << 20);
    expect(out?.headers.etag).toBe('W/"v1"');
  });

  it('leaves the response as stored when the retry takes the coding, or nothing is encoded', () => {
    expect(negotiatedBody({ 'content-encoding': 'gzip' }, gzipSync(json), 'gzip', 1 << 20)).toBeUndefined();
    expect(negotiatedBody({ 'content-type': 'text/plain' }, json, undefined, 1 << 20)).toBeUndefined();
    expect(negotiatedBody({ 'content-encoding': 'identity' }, json, undefined, 1 << 20)).toBeUndefined();
  });

  it('serves as stored what it cannot undo: an unknown coding, a list of codings, bad bytes, or more than the cap', () => {
    expect(negotiatedBody({ 'content-encoding': 'compress' }, json, undefined, 1 << 20)).toBeUndefined();
    const twice = gzipSync(brotliCompressSync(json));
    expect(negotiatedBody({ 'content-encoding': 'br, gzip' }, twice, undefined, 1 << 20)).toBeUndefined();
    expect(negotiatedBody({ 'content-encoding': 'gzip' }, json, undefined, 1 << 20)).toBeUndefined();
    const bomb = gzipSync(Buffer.alloc(1 << 20));
    expect(negotiatedBody({ 'content-encoding': 'gzip' }, bomb, undefined, 1024)).toBeUndefined();
    // The prototype is no decoder.
    expect(negotiatedBody({ 'content-encoding': 'constructor' }, json, undefined, 1 << 20)).toBeUndefined();
  });
});

describe('replay: a stored compressed body is decoded up to 16 × maxResponseBytes', () => {
  const http = createHttpIdempotency({ store: memoryStore(), maxResponseBytes: 1024 });
  const stored = (size: number) => ({
    status: 201,
    headers: { 'content-type': 'text/plain', 'content-encoding': 'gzip' },
    body: gzipSync(Buffer.alloc(size, 'a')),
  });

  it('decodes a body that fits the cap', () => {
    const replay = http.replay(stored(16 * 1024), '"k"', 'identity');
    expect(replay.headers['content-encoding']).toBeUndefined();
    expect(replay.body.length).toBe(16 * 1024);
  });

  it('serves one byte more as stored, compressed, rather than inflate it on the event loop', () => {
    const body = stored(16 * 1024 + 1);
    const replay = http.replay(body, '"k"', 'identity');
    expect(replay.headers['content-encoding']).toBe('gzip');
    expect(Buffer.from(replay.body).equals(body.body)).toBe(true);
  });
});
