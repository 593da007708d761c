import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import {
  assertStoredResponse,
  createIdempotency,
  type IdempotencyEvent,
  InvalidResponseError,
  isResponseTooLargeError,
  memoryStore,
  ResponseTooLargeError,
  type StoredResponse,
  storedResponseSize,
} from '../src/index.js';

const body = new Uint8Array([1, 2, 3]);

describe('assertStoredResponse', () => {
  it('accepts what every store keeps and gives back as it was', () => {
    const accepted: StoredResponse[] = [
      { status: 100, headers: {}, body: new Uint8Array(0) },
      { status: 599, headers: { 'content-type': 'application/json', 'x-A_b.c~1': 'v' }, body },
      { status: 201, headers: { etag: 'W/"é\t1"', empty: '' }, body: Buffer.from('buffer') },
      { status: 204, headers: Object.assign(Object.create(null), { link: '</a>; rel="next"' }), body },
    ];
    for (const response of accepted) expect(() => assertStoredResponse(response)).not.toThrow();
  });

  it.each([
    ['no response', undefined],
    ['a status that is not a number', { status: '200', headers: {}, body }],
    ['a status that is not an integer', { status: 200.5, headers: {}, body }],
    ['a status under 100', { status: 99, headers: {}, body }],
    ['a status over 599', { status: 600, headers: {}, body }],
    ['missing headers', { status: 200, body }],
    ['headers as an array', { status: 200, headers: [], body }],
    ['headers as a Map', { status: 200, headers: new Map(), body }],
    ['headers as a class instance', { status: 200, headers: new (class Headers {})(), body }],
    ['a header value that is a number', { status: 200, headers: { 'content-length': 3 }, body }],
    ['a header value that is an array', { status: 200, headers: { 'set-cookie': ['a=1'] }, body }],
    ['a NUL in a header value', { status: 200, headers: { a: 'x\u0000' }, body }],
    ['a line break in a header value', { status: 200, headers: { a: 'x\ny' }, body }],
    ['a character over U+00FF in a header value', { status: 200, headers: { a: '\u20ac' }, body }],
    ['a lone surrogate in a header value', { status: 200, headers: { a: '\ud800' }, body }],
    ['an empty header name', { status: 200, headers: { '': 'x' }, body }],
    ['a space in a header name', { status: 200, headers: { 'a b': 'x' }, body }],
    ['a body that is a string', { status: 200, headers: {}, body: 'text' }],
    ['a body that is an ArrayBuffer', { status: 200, headers: {}, body: new ArrayBuffer(1) }],
    ['a body of 16-bit units', { status: 200, headers: {}, body: new Uint16Array(1) }],
  ])('refuses %s with InvalidResponseError, a TypeError with code response_invalid', (_, response) => {
    const error = (() => {
      try {
        assertStoredResponse(response);
      } catch (caught) {
        return caught;
      }
    })();
    expect(error).toBeInstanceOf(InvalidResponseError);
    expect(error).toBeInstanceOf(TypeError);
    expect(error).toMatchObject({ name: 'InvalidResponseError', code: 'response_invalid' });
  });

  it('measures status, headers and body, and refuses a response over maxBytes with ResponseTooLargeError', () => {
    const response = { status: 201, headers: { 'content-type': 'text/plain' }, body: new Uint8Array(100) };
    // {"s":201,"h":{"content-type":"text/plain"}} and a newline: 44 bytes before the body.
    expect(storedResponseSize(response)).toBe(144);
    expect(() => assertStoredResponse(response, { maxBytes: 144 })).not.toThrow();
    const error = (() => {
      try {
        assertStoredResponse(response, { maxBytes: 143 });
      } catch (caught) {
        return caught;
      }
    })();
    expect(error).toBeInstanceOf(ResponseTooLargeError);
    expect(error).toMatchObject({ code: 'response_too_large', bytes: 144, limit: 143 });
    expect(isResponseTooLargeError(error)).toBe(true);
    // Headers count in UTF-8 bytes, as a store writes them.
    expect(storedResponseSize({ status: 200, headers: { a: 'é' }, body: new Uint8Array(0) })).toBe(15 + 10);
  });

  it('checks the shape before the size: an invalid response is invalid whatever the limit', () => {
    expect(() => assertStoredResponse({ status: 200, headers: { a: 1 }, body }, { maxBytes: 1 })).toThrow(
      InvalidResponseError,
    );
  });

  it('tells a ResponseTooLargeError from another copy of the package by name and code', () => {
    const copy = Object.assign(new Error('x'), { name: 'ResponseTooLargeError', code: 'response_too_large' });
    expect(isResponseTooLargeError(copy)).toBe(true);
    expect(isResponseTooLargeError(new Error('x'))).toBe(false);
    expect(isResponseTooLargeError({ name: 'ResponseTooLargeError', code: 'response_too_large' })).toBe(false);
  });
});

describe('memoryStore refuses what no store could replay', () => {
  it('through the engine: a store-error event, the key free for a retry, not a poisoned replay', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store: memoryStore(), onEvent: (event) => events.push(event) });
    const request = { key: 'k1', scope: 'user:1', operation: 'POST /charges' };
    const first = await engine.begin(request);
    expect(first.kind).toBe('execute');
    if (first.kind !== 'execute') return;
    // A header with a line break: Node would refuse to write it on every replay of the key.
    const result = await engine.complete(first.lease, { status: 201, headers: { location: '/a\r\nb' }, body });
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toBeInstanceOf(InvalidResponseError);
    expect(events.some((e) => e.type === 'store-error' && e.phase === 'complete')).toBe(true);
    expect((await engine.begin(request)).kind).toBe('execute');
  });
});
