// Request bodies within the default body cap (1 MiB) that cost the fingerprint far more than their
// size should, found by an audit of algorithmic complexity; each test failed when written.
import { expect, it } from 'vitest';
import { canonicalJson, rawJson } from '../src/canonical-json.js';
import { fingerprintRequest } from '../src/fingerprint.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';

const maxBodyBytes = 1024 * 1024;

// An array nested 200,000 deep inside a member: 400 KB, well under the body cap. JSON.parse reads it
// (V8's parser does not recurse); anything that recurses over the parsed value overflows the stack.
const deep = 200_000;
const deepBody = `{"sentAt":1,"items":${'['.repeat(deep)}${']'.repeat(deep)}}`;

// Was a defect: with `fingerprint.exclude` configured, a JSON body nested deeper than the stack allows
// makes fingerprintRequest throw a RangeError: withoutPointers (src/fingerprint.ts) copies the parsed
// body with structuredClone, which recurses, and nothing catches it. Every other path already copes
// with such a body (canonicalJson has maxDepth, serialised() falls back to compactJson, bodyForHash
// catches JSON.parse): the fingerprint should fall back to the body's bytes (or clone only the path
// the pointers walk) instead of throwing.
it('a JSON body nested 200,000 deep (400 KB) is fingerprinted with exclude configured, not a RangeError', () => {
  expect(deepBody.length).toBeLessThan(maxBodyBytes);
  const fingerprint = () =>
    fingerprintRequest(
      { method: 'POST', route: '/orders', path: '/orders', contentType: 'application/json', body: deepBody },
      { exclude: ['/sentAt'] },
    );
  expect(fingerprint).not.toThrow();
});

// Was a defect: the same body through the framework-free adapter core: begin() rejects with the
// RangeError (fingerprintRequest is called outside any try), so Express hands it to its final
// handler (500), Fastify and Koa answer 500 too; one small request, a server error, and under the
// key nothing is claimed. Expected: the request goes on (`execute`) or is refused with a 4xx.
it('createHttpIdempotency.begin() with exclude: a deeply nested body neither rejects nor crashes', async () => {
  const http = createHttpIdempotency({ store: memoryStore(), fingerprint: { exclude: ['/sentAt'] } });
  const started = await http.begin({
    method: 'POST',
    route: '/orders',
    path: '/orders',
    query: '',
    contentType: 'application/json',
    keyHeader: '"deep-1"',
    body: Buffer.from(deepBody),
    scope: 'tenant-deep',
  });
  expect(['execute', 'respond']).toContain(started.kind);
});

// Was a defect: an integer of many digits is turned into a bigint by the exactIntegers reviver
// (src/fingerprint.ts, `BigInt(source)`) and written back with bigint.toString() by canonicalJson:
// decimal-to-binary and back is super-linear in the digit count, so one 1 MiB body holding a single
// integer costs ~1-1.5 s of event loop (about 100 times a 1 MiB string or float body; measured
// 260 ms at 250k digits, 1.5 s at 1M). Since JSON forbids leading zeros, BigInt(source).toString()
// is always `source` itself: keep the source text (e.g. JSON.rawJSON(source), or a wrapper the
// canonical writer prints as is), or hash bodies with integers past some length as bytes. The check
// here is structural, not timed: no digit string longer than 10,000 is handed to BigInt.
it('fingerprinting a body with a 1,000,000-digit integer converts no huge digit string to a bigint', () => {
  const body = `{"amount":${'9'.repeat(1_000_000)}}`;
  expect(body.length).toBeLessThan(maxBodyBytes);
  const realBigInt = globalThis.BigInt;
  let longest = 0;
  const spy = (value: string | number | bigint | boolean) => {
    if (typeof value === 'string') longest = Math.max(longest, value.length);
    return realBigInt(value);
  };
  globalThis.BigInt = spy as BigIntConstructor;
  try {
    fingerprintRequest({ method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json', body });
  } finally {
    globalThis.BigInt = realBigInt;
  }
  expect(longest).toBeLessThan(10_000);
});

// The raw JSON the reviver now leaves is written as what it stands for: digits as they are, any
// other raw text as the value it holds.
it('canonicalJson writes raw JSON integers as their digits and other raw text as its value', () => {
  expect(canonicalJson({ b: rawJson('123456789012345678901234567890'), a: rawJson('1.50') })).toBe(
    '{"a":1.5,"b":123456789012345678901234567890}',
  );
});
