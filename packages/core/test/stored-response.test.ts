import { Buffer } from 'node:buffer';
import { runInNewContext } from 'node:vm';
import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import {
  assertStoredResponse,
  createIdempotency,
  defaultMaxResponseBytes,
  type IdempotencyEvent,
  InvalidResponseError,
  isResponseTooLargeError,
  memoryStore,
  ResponseTooLargeError,
  responseLimit,
  type Store,
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

  it("accepts headers made in another realm (a vm context, a worker's structured clone): still a plain object", () => {
    const headers = runInNewContext('({ "content-type": "text/plain" })') as Record<string, string>;
    expect(Object.getPrototypeOf(headers)).not.toBe(Object.prototype);
    expect(() => assertStoredResponse({ status: 200, headers, body })).not.toThrow();
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
    // Was wrong: taken, since its prototype's prototype is null; a store writing JSON wrote `{}`, the inherited
    // `location` lost without a word. The rule is @idem/core's isPlainObject now, canonical JSON's.
    [
      'headers over a null-prototype object holding them',
      { status: 200, headers: Object.create(Object.assign(Object.create(null), { location: '/a' })), body },
    ],
    ['headers as a Map of another realm', { status: 200, headers: runInNewContext('new Map()'), body }],
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

  it('says whether the name or the value of a header is wrong', () => {
    // The checks are local (header-syntax.ts, held to Node's by its property test): no Node error
    // to keep as the cause, so the message is what tells the two apart.
    const name = 'a response header name is not an HTTP token';
    const value = 'a response header value is not a string of HTTP field-value characters';
    const cases: [Record<string, unknown>, string][] = [
      [{ 'a:b': 'x' }, name],
      [{ 'a\n': 'x' }, name],
      [{ a: 'x\ny' }, value],
      [{ a: 'x\u007f' }, value],
      [{ a: 1 }, value],
    ];
    for (const [headers, message] of cases) {
      expect(() => assertStoredResponse({ status: 200, headers, body })).toThrow(new InvalidResponseError(message));
    }
  });

  it('responseLimit: the default of 4 MiB, or an integer from 1 to the ceiling, else a TypeError naming the option', () => {
    expect(defaultMaxResponseBytes).toBe(4 * 1024 * 1024);
    expect(responseLimit(undefined, 10 * 1024 * 1024, 'maxResponseBytes')).toBe(defaultMaxResponseBytes);
    expect(responseLimit(1, 100, 'maxResponseBytes')).toBe(1);
    expect(responseLimit(100, 100, 'maxResponseBytes')).toBe(100);
    for (const bad of [0, -1, 1.5, 101, Number.NaN, Number.POSITIVE_INFINITY, '50']) {
      expect(() => responseLimit(bad as number, 100, 'maxResponseBytes')).toThrow(
        new TypeError('maxResponseBytes must be an integer from 1 to 100'),
      );
    }
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

describe('the engine refuses, before any store sees it, a response no store could give back as it was', () => {
  // Each would be stored by some store and then fail every read or replay of its key until its
  // retention ended (PostgreSQL: a NUL in jsonb; Redis: a header that is not a string; Node: a header
  // with a line break). The engine refuses them for every store alike: stores only keep their size cap.
  const unreadable = [
    { status: Number.NaN, headers: {}, body },
    { status: '201', headers: {}, body },
    { status: 201.5, headers: {}, body },
    { status: 99, headers: {}, body },
    { status: 600, headers: {}, body },
    { status: 2 ** 31, headers: {}, body },
    { status: 201, headers: null, body },
    { status: 201, headers: [['content-type', 'text/plain']], body },
    { status: 201, headers: new Map([['content-type', 'text/plain']]), body },
    { status: 201, headers: { 'content-length': 12 }, body },
    { status: 201, headers: { 'set-cookie': ['a=1', 'b=2'] }, body },
    { status: 201, headers: { etag: 'a\u0000b' }, body },
    { status: 201, headers: { location: '/a\r\nset-cookie: x=1' }, body },
    { status: 201, headers: { 'x-name': '\u20ac' }, body },
    { status: 201, headers: { 'bad name': 'x' }, body },
    { status: 201, headers: {}, body: 'text' },
    { status: 201, headers: {}, body: [1, 2] },
    { status: 201, headers: {}, body: new Uint16Array([1]) },
    { status: 201, headers: {}, body: undefined },
  ] as unknown as StoredResponse[];
  const good: StoredResponse = { status: 201, headers: { etag: '"v1"\t\u00e9' }, body: new Uint8Array([2]) };

  // A memory store that counts what reaches its complete().
  const counted = () => {
    const inner = memoryStore();
    const seen = { completions: 0 };
    const store: Store = {
      claim: (input) => inner.claim(input),
      renew: (input) => inner.renew(input),
      release: (input) => inner.release(input),
      get: (id) => inner.get(id),
      complete: (input) => {
        seen.completions++;
        return inner.complete(input);
      },
    };
    return { store, inner, seen };
  };

  it('engine.complete: a store-error event with InvalidResponseError, the key released, the store never called', async () => {
    const { store, inner, seen } = counted();
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
    for (const [i, bad] of unreadable.entries()) {
      const request = { key: `k${i}`, scope: 'user:1', operation: 'POST /charges' };
      const first = await engine.begin(request);
      if (first.kind !== 'execute') throw new Error(first.kind);
      events.length = 0;
      const completions = seen.completions;
      const result = await engine.complete(first.lease, bad);
      expect(seen.completions).toBe(completions);
      expect(result, JSON.stringify(bad)).toMatchObject({ ok: false, reason: 'store-error' });
      const error = !result.ok && result.error;
      expect(error).toBeInstanceOf(InvalidResponseError);
      expect(error).toBeInstanceOf(TypeError);
      expect(error).toMatchObject({ code: 'response_invalid' });
      expect(events).toMatchObject([{ type: 'store-error', phase: 'complete', error }]);
      // The key is free again: a retry runs the handler, rather than meet a poisoned replay.
      await expect.poll(() => inner.get(first.lease.id)).toBeUndefined();
      const retry = await engine.begin(request);
      if (retry.kind !== 'execute') throw new Error(retry.kind);
      expect(await engine.complete(retry.lease, good)).toEqual({ ok: true, stored: true });
      const replay = await engine.begin(request);
      expect(replay.kind === 'replay' && replay.response.headers).toEqual(good.headers);
    }
  });

  it("engine.transaction: the handler's writes roll back, a store-error event, the key released", async () => {
    const inner = memoryStore();
    const outcomes: string[] = [];
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: transactionalMemoryStore({ store: inner, onOutcome: (_, outcome) => outcomes.push(outcome) }),
      heartbeat: false,
      onEvent: (event) => events.push(event),
    });
    for (const [i, bad] of unreadable.entries()) {
      const request = { key: `k${i}`, scope: 'user:1', operation: 'POST /charges' };
      const first = await engine.begin(request);
      if (first.kind !== 'execute') throw new Error(first.kind);
      events.length = 0;
      outcomes.length = 0;
      const result = await engine.transaction(first.lease, async () => ({ value: 1, response: bad }));
      expect(result, JSON.stringify(bad)).toMatchObject({ committed: false, reason: 'store-error' });
      const error = !result.committed && result.error;
      expect(error).toBeInstanceOf(InvalidResponseError);
      // Refused inside the transaction, before the store's commit: everything rolls back.
      expect(outcomes).toEqual(['rolled-back']);
      expect(events).toMatchObject([{ type: 'store-error', phase: 'transaction', error }]);
      expect(inner.get(first.lease.id)).toBeUndefined();
      expect((await engine.begin(request)).kind).toBe('execute');
    }
  });
});
