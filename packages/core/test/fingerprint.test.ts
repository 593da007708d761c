import fc from 'fast-check';
import { describe, expect, it, vi } from 'vitest';
import { canonicalJson } from '../src/canonical-json.js';
import { toMilliseconds } from '../src/duration.js';
import { fingerprintRequest, fingerprintsMatch, isJsonContentType, jsonBodyText } from '../src/fingerprint.js';
import { recordId } from '../src/record-id.js';

describe('canonicalJson (RFC 8785)', () => {
  it('sorts members by UTF-16 code units and writes numbers the ECMAScript way', () => {
    // The RFC's own sorting example: keys ordered by code units, not by code points or locale.
    const value = {
      '\u20ac': 'Euro Sign',
      '\r': 'Carriage Return',
      '\ufb33': 'Hebrew',
      '1': 'One',
      '\ud83d\ude00': 'Emoji',
      '\u0080': 'Control',
      '\u00f6': 'Latin',
    };
    const text = canonicalJson(value) as string;
    const order = ['\r', '1', '\u0080', '\u00f6', '\u20ac', '\ud83d\ude00', '\ufb33'].map((key) =>
      text.indexOf(JSON.stringify(key)),
    );
    expect(order.every((position, i) => position > 0 && (i === 0 || position > (order[i - 1] as number)))).toBe(true);
    expect(canonicalJson({ b: [1e21, 0.1, -0, 1e-7], a: null })).toBe('{"a":null,"b":[1e+21,0.1,0,1e-7]}');
    expect(canonicalJson({ s: 'é\u2028"' })).toBe('{"s":"é\u2028\\""}');
  });

  it('writes exactly what the plain reading of RFC 8785 writes, for any JSON value (property test)', () => {
    // The reference: the definition, one member at a time, with the default sort and JSON.stringify.
    const reference = (value: unknown): string => {
      if (value === null || typeof value !== 'object') return JSON.stringify(value);
      if (Array.isArray(value)) return `[${value.map(reference).join(',')}]`;
      const object = value as Record<string, unknown>;
      return `{${Object.keys(object)
        .sort()
        .map((key) => `${JSON.stringify(key)}:${reference(object[key])}`)
        .join(',')}}`;
    };
    // Every code unit, lone surrogates and control characters included, in keys and in values; and
    // more than 16 members, where the sort changes method.
    const tricky = fc.constantFrom(
      'a',
      'Z',
      '1',
      '"',
      '\\',
      '/',
      '\n',
      '\u0000',
      '\u001f',
      '\u007f',
      'é',
      '€',
      '\ud800',
      '\udc00',
    );
    const text = fc.oneof(fc.string({ unit: 'binary', maxLength: 12 }), fc.string({ unit: tricky, maxLength: 8 }));
    const value = fc.letrec((tie) => ({
      node: fc.oneof(
        { depthSize: 'small' },
        fc.constant(null),
        fc.boolean(),
        fc.double({ noNaN: true, noDefaultInfinity: true }),
        fc.integer(),
        text,
        fc.array(tie('node'), { maxLength: 5 }),
        fc.dictionary(text, tie('node'), { maxKeys: 20 }),
      ),
    })).node;
    fc.assert(
      fc.property(value, (input) => {
        const parsed = JSON.parse(JSON.stringify(input));
        expect(canonicalJson(parsed)).toBe(reference(parsed));
      }),
      { numRuns: 1_000 },
    );
  });

  it('gives up on hostile depth instead of overflowing the stack', () => {
    let deep: unknown = 1;
    for (let i = 0; i < 10_000; i++) deep = [deep];
    expect(canonicalJson(deep)).toBeUndefined();
  });
});

describe('fingerprintRequest', () => {
  it('takes one spelling of a path: escaped unreserved characters are the characters, other escapes stay', () => {
    const of = (path: string) =>
      fingerprintRequest({ method: 'POST', route: '/events/:id', path, contentType: 'application/json', body: '{}' });
    expect(of('/events/evt%5F1')).toBe(of('/events/evt_1'));
    expect(of('/events/evt%5f1')).toBe(of('/events/evt_1'));
    expect(of('/events/a%2fb')).toBe(of('/events/a%2Fb'));
    expect(of('/events/a%2Fb')).not.toBe(of('/events/a/b'));
    expect(of('/events/Evt_1')).not.toBe(of('/events/evt_1'));
  });

  const base = { method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json; charset=utf-8' };

  it('gives a body already parsed from JSON the fingerprint of its raw bytes (property test)', () => {
    fc.assert(
      fc.property(fc.jsonValue(), fc.boolean(), (value, sorted) => {
        // The raw text as a client could send it: any member order, any whitespace.
        const text = sorted ? (canonicalJson(value) ?? 'null') : JSON.stringify(value, null, 1);
        expect(fingerprintRequest({ ...base, json: JSON.parse(text) })).toBe(
          fingerprintRequest({ ...base, body: text }),
        );
      }),
      { numRuns: 300 },
    );
  });

  it('hashes a parsed body that is not plain JSON data, or not JSON, as the bytes it serialises to', () => {
    // A reviver's Date has no canonical form of its own: two different dates must not match.
    const at = (iso: string) => ({ amount: 1, at: new Date(iso) });
    const first = fingerprintRequest({ ...base, json: at('2026-01-01T00:00:00.000Z') });
    expect(first).toBe(fingerprintRequest({ ...base, body: JSON.stringify(at('2026-01-01T00:00:00.000Z')) }));
    expect(first).not.toBe(fingerprintRequest({ ...base, json: at('2026-01-02T00:00:00.000Z') }));
    // A form parsed into an object: its JSON text is hashed as bytes, as before the parsed path.
    const form = { ...base, contentType: 'application/x-www-form-urlencoded' };
    expect(fingerprintRequest({ ...form, json: { a: '1', b: '2' } })).toBe(
      fingerprintRequest({ ...form, body: Buffer.from(JSON.stringify({ a: '1', b: '2' })) }),
    );
    // With exclusions, the parsed path and the bytes path agree too.
    const exclude = ['/at'];
    expect(fingerprintRequest({ ...base, json: { amount: 1, at: 'x' } }, { exclude })).toBe(
      fingerprintRequest({ ...base, body: '{"at":"y","amount":1}' }, { exclude }),
    );
  });

  it('treats method, route, path, query order, media type and body as the identity', () => {
    const a = fingerprintRequest({ ...base, query: 'a=1&b=2', body: '{"x":1}' });
    expect(fingerprintRequest({ ...base, query: '?b=2&a=1', body: '{"x":1}' })).toBe(a);
    expect(fingerprintRequest({ ...base, query: { b: '2', a: '1' }, body: '{"x":1}' })).toBe(a);
    expect(fingerprintRequest({ ...base, query: 'a=1&a=2&b=2', body: '{"x":1}' })).not.toBe(a);
    expect(fingerprintRequest({ ...base, method: 'PATCH', query: 'a=1&b=2', body: '{"x":1}' })).not.toBe(a);
    expect(fingerprintRequest({ ...base, path: '/charges/2', query: 'a=1&b=2', body: '{"x":1}' })).not.toBe(a);
    expect(fingerprintRequest({ ...base, contentType: 'text/plain', query: 'a=1&b=2', body: '{"x":1}' })).not.toBe(a);
  });

  it("a repeated name's values keep their order: the handler sees ['1', '2'] or ['2', '1'], two requests", () => {
    const first = fingerprintRequest({ ...base, query: 'ids=1&ids=2' });
    expect(fingerprintRequest({ ...base, query: 'ids=2&ids=1' })).not.toBe(first);
    expect(fingerprintRequest({ ...base, query: { ids: ['2', '1'] } })).not.toBe(first);
    // Names are still sorted, and each name's values move with it in the order they came.
    expect(fingerprintRequest({ ...base, query: 'b=x&ids=1&a=y&ids=2' })).toBe(
      fingerprintRequest({ ...base, query: 'ids=1&a=y&ids=2&b=x' }),
    );
    expect(fingerprintRequest({ ...base, query: { ids: ['1', '2'] } })).toBe(first);
    expect(fingerprintRequest({ ...base, query: new URLSearchParams('ids=1&ids=2') })).toBe(first);
  });

  it('case 20: form, multipart, binary and invalid JSON hash their bytes deterministically', () => {
    const form = { ...base, contentType: 'application/x-www-form-urlencoded' };
    expect(fingerprintRequest({ ...form, body: 'a=1&b=2' })).toBe(fingerprintRequest({ ...form, body: 'a=1&b=2' }));
    expect(fingerprintRequest({ ...form, body: 'a=1&b=2' })).not.toBe(fingerprintRequest({ ...form, body: 'b=2&a=1' }));
    const binary = new Uint8Array([0xff, 0xfe, 0x00, 0x01]);
    expect(fingerprintRequest({ ...base, body: binary })).toBe(
      fingerprintRequest({ ...base, body: new Uint8Array(binary) }),
    );
    expect(fingerprintRequest({ ...base, body: '{"x":' })).toBe(fingerprintRequest({ ...base, body: '{"x":' }));
    // Canonical JSON text can never be confused with a raw body holding the same characters.
    expect(fingerprintRequest({ ...base, body: '{"x":1}' })).not.toBe(
      fingerprintRequest({ ...base, contentType: 'text/plain', body: 'json:{"x":1}' }),
    );
  });

  it('excludes nested and array fields named by JSON Pointer', () => {
    const fp = (body: string) =>
      fingerprintRequest({ ...base, body }, { exclude: ['/meta/nonce', '/tags/0', '/a~1b'] });
    expect(fp('{"amount":1,"meta":{"nonce":"x"},"tags":["t1","t2"],"a/b":1}')).toBe(
      fp('{"amount":1,"meta":{"nonce":"y"},"tags":["t9","t2"],"a/b":2}'),
    );
    expect(fp('{"amount":1}')).not.toBe(fp('{"amount":2}'));
  });

  it('compares in constant time and treats an empty fingerprint as "not fingerprinted"', () => {
    expect(fingerprintsMatch('abc', 'abc')).toBe(true);
    expect(fingerprintsMatch('abc', 'abd')).toBe(false);
    expect(fingerprintsMatch('abc', 'abcd')).toBe(false);
    expect(fingerprintsMatch('', 'abc')).toBe(true);
  });
});

describe('fingerprintsMatch reads every character, wherever the first difference is', () => {
  // Not a timing measurement (the suite asserts no timers): the comparison's work is counted. An
  // early exit (`===`, a loop that stops at the first difference) reads fewer characters when the
  // difference comes first, and leaks where it is through the time it takes.
  it('reads both fingerprints in full for a match, a difference in the first and in the last character', () => {
    const stored = 'a'.repeat(64);
    const reads = (sent: string) => {
      const spy = vi.spyOn(String.prototype, 'charCodeAt');
      try {
        const matched = fingerprintsMatch(stored, sent);
        return { matched, reads: spy.mock.calls.length };
      } finally {
        spy.mockRestore();
      }
    };
    expect(reads(stored)).toEqual({ matched: true, reads: 128 });
    expect(reads(`b${'a'.repeat(63)}`)).toEqual({ matched: false, reads: 128 });
    expect(reads(`${'a'.repeat(63)}b`)).toEqual({ matched: false, reads: 128 });
  });
});

describe('isJsonContentType', () => {
  it('is true exactly for the media types whose bodies are canonicalised', () => {
    for (const type of [
      'application/json',
      'Application/JSON; charset=utf-8',
      ' application/merge-patch+json ',
      'application/vnd.api+json;v=2',
    ])
      expect(isJsonContentType(type)).toBe(true);
    for (const type of [
      undefined,
      '',
      'text/json',
      'application/jsonl',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=json',
    ])
      expect(isJsonContentType(type)).toBe(false);
  });

  it('agrees with the fingerprint: JSON types ignore key order, others hash bytes', () => {
    for (const contentType of [
      'application/json; charset=utf-8',
      'application/problem+json',
      'text/plain',
      'application/jsonl',
    ]) {
      const a = fingerprintRequest({ method: 'POST', contentType, body: '{"a":1,"b":2}' });
      const b = fingerprintRequest({ method: 'POST', contentType, body: '{"b":2,"a":1}' });
      expect(a === b).toBe(isJsonContentType(contentType));
    }
  });
});

describe('jsonBodyText (a parsed body whose bytes are gone)', () => {
  const json = 'application/json';
  const viaValue = (value: unknown) => fingerprintRequest({ method: 'POST', contentType: json, json: value });
  const viaBytes = (text: string) => fingerprintRequest({ method: 'POST', contentType: json, body: text });

  it('is the canonical form of plain data, and fingerprints as the value does', () => {
    const value = { b: [1, { d: null, c: 'é' }], a: true };
    expect(jsonBodyText(value)).toBe('{"a":true,"b":[1,{"c":"é","d":null}]}');
    expect(viaBytes(jsonBodyText(value))).toBe(viaValue(value));
  });

  it('writes what JSON.stringify writes for what a reviver made (no canonical form)', () => {
    const value = { at: new Date(0), n: 1 };
    expect(jsonBodyText(value)).toBe(JSON.stringify(value));
    expect(viaBytes(jsonBodyText(value))).toBe(viaValue(value));
  });

  it('nesting deeper than the stack is written without recursion, as a compact body of the same bytes', () => {
    for (const text of [
      `${'['.repeat(50_000)}${']'.repeat(50_000)}`,
      `${'{"a":'.repeat(20_000)}[1,"x",null,true,{}]${'}'.repeat(20_000)}`,
    ]) {
      const value = JSON.parse(text);
      // With a replacer, as the fingerprint calls it (V8 14, Node 25+, no longer overflows without one).
      expect(() => JSON.stringify(value, (_key, item: unknown) => item)).toThrow(RangeError);
      expect(jsonBodyText(value)).toBe(text);
      // Too deep for a canonical form: the parsed value and the raw bytes give one fingerprint.
      expect(viaValue(value)).toBe(viaBytes(text));
    }
  });

  it('writes the bigints of a parser that keeps big integers exact as the numbers they were read from', () => {
    const text = '{"amount":123456789012345678901234,"list":[1,-98765432109876543210]}';
    const value = JSON.parse(text, (_key, parsed, context?: { source?: string }) =>
      typeof parsed === 'number' && !Number.isSafeInteger(parsed) && context?.source ? BigInt(context.source) : parsed,
    );
    expect(typeof value.amount).toBe('bigint');
    expect(jsonBodyText(value)).toBe(text);
    // The same fingerprint as the bytes, which a chunked request (read raw) would give.
    expect(viaValue(value)).toBe(viaBytes(text));
    // Also when nested deeper than JSON.stringify can recurse.
    const deep = `${'['.repeat(20_000)}12345678901234567890${']'.repeat(20_000)}`;
    let nested: unknown = 12345678901234567890n;
    for (let i = 0; i < 20_000; i++) nested = [nested];
    expect(jsonBodyText(nested)).toBe(deep);
    expect(viaValue(nested)).toBe(viaBytes(deep));
  });

  it('keeps integers past 2^53 exact: two amounts a double cannot tell apart are two requests', () => {
    const parts = { method: 'POST', route: '/c', path: '/c', contentType: 'application/json' };
    const a = fingerprintRequest({ ...parts, body: '{"amount":9007199254740993,"currency":"usd"}' });
    const b = fingerprintRequest({ ...parts, body: '{"amount":9007199254740992,"currency":"usd"}' });
    expect(a).not.toBe(b);
    // Still canonical: member order and whitespace do not matter, and a parser that kept the
    // bigint gives the fingerprint of the bytes.
    expect(fingerprintRequest({ ...parts, body: '{ "currency": "usd", "amount": 9007199254740993 }' })).toBe(a);
    expect(
      fingerprintRequest({ ...parts, body: undefined, json: { currency: 'usd', amount: 9007199254740993n } }),
    ).toBe(a);
    // Numbers that are not integers keep RFC 8785's double semantics.
    expect(fingerprintRequest({ ...parts, body: '{"x":12345678901234567.5}' })).toBe(
      fingerprintRequest({ ...parts, body: '{"x":12345678901234568}' }),
    );
    expect(canonicalJson({ big: 123456789012345678901234567890n })).toBe('{"big":123456789012345678901234567890}');
  });

  it('a value JSON.stringify refuses for another reason is refused the same way', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(() => jsonBodyText(cyclic)).toThrow(TypeError);
    expect(() => jsonBodyText({ f: Symbol('x'), cyclic })).toThrow(TypeError);
  });
});

describe('recordId and durations', () => {
  it('is 43 base64url characters and separates its parts', () => {
    expect(recordId('a', 'b', 'c')).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(recordId('a:b', 'c', 'd')).not.toBe(recordId('a', 'b:c', 'd'));
  });

  it('reads durations and refuses nonsense', () => {
    expect(toMilliseconds('24h')).toBe(86_400_000);
    expect(toMilliseconds('1.5s')).toBe(1_500);
    expect(toMilliseconds('250ms')).toBe(250);
    expect(toMilliseconds('7d')).toBe(604_800_000);
    expect(toMilliseconds(10)).toBe(10);
    // Whitespace around a string duration (an untyped option, read from the environment) is not part of it.
    expect(toMilliseconds(' 10s ' as never)).toBe(10_000);
    for (const bad of ['10 parsecs', '-1s', '', 'h', Number.NaN, -5, Number.POSITIVE_INFINITY]) {
      expect(() => toMilliseconds(bad as never)).toThrow(TypeError);
    }
  });
});

describe('canonicalJson edges', () => {
  it('gives a non-finite number no canonical form (written as null, 1e400 would be one request with null)', () => {
    for (const number of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
      expect(canonicalJson({ a: 1, b: [number] }), String(number)).toBeUndefined();
    }
    expect(canonicalJson({ a: Number.MAX_VALUE, b: -Number.MIN_VALUE })).toBe(
      '{"a":1.7976931348623157e+308,"b":-5e-324}',
    );
  });

  it('fingerprints a number that overflows a double apart from null and from its opposite, from bytes or parsed', () => {
    const request = { method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json' };
    const bodies = ['{"amount":null}', '{"amount":1e400}', '{"amount":-1e400}'];
    const fromBytes = bodies.map((body) => fingerprintRequest({ ...request, body: Buffer.from(body) }));
    expect(new Set(fromBytes).size).toBe(3);
    // What a parser made of them (Fastify, or Express after express.json()): null, Infinity, -Infinity.
    const fromValues = bodies.map((body) => fingerprintRequest({ ...request, json: JSON.parse(body) }));
    expect(new Set(fromValues).size).toBe(3);
    // The parsed value is written as the compact text a client sends, which fingerprints as those bytes.
    expect(fromValues).toEqual(fromBytes);
    expect(jsonBodyText({ amount: Number.NEGATIVE_INFINITY, n: [Number.POSITIVE_INFINITY] })).toBe(
      '{"amount":-1e400,"n":[1e400]}',
    );
  });

  it("writes a non-finite number as 1e400 with its sign also past the stack, and a reviver's NaN as null", () => {
    // Nested deeper than JSON.stringify can recurse: the compact writer gives the client's bytes too.
    const deep = `${'['.repeat(20_000)}-1e400,1e400${']'.repeat(20_000)}`;
    const value = JSON.parse(deep);
    expect(() => JSON.stringify(value, (_key, item: unknown) => item)).toThrow(RangeError);
    expect(jsonBodyText(value)).toBe(deep);
    // NaN is no number a JSON parser gives: written as JSON.stringify writes it, never as 1e400.
    expect(jsonBodyText({ amount: Number.NaN })).toBe('{"amount":null}');
    let nested: unknown = Number.NaN;
    for (let i = 0; i < 20_000; i++) nested = [nested];
    expect(jsonBodyText(nested)).toBe(`${'['.repeat(20_000)}null${']'.repeat(20_000)}`);
  });

  it('sorts a long member list too (more than 16 members, where the sort changes method)', () => {
    const names = Array.from({ length: 20 }, (_, i) => `k${String(i).padStart(2, '0')}`);
    const value = Object.fromEntries([...names].reverse().map((name) => [name, 1]));
    expect(canonicalJson(value)).toBe(`{${names.map((name) => `"${name}":1`).join(',')}}`);
  });

  it('has no canonical form for what is not JSON data: undefined, a function, a symbol', () => {
    for (const value of [undefined, () => 1, Symbol('s'), { a: undefined }, [() => 1]])
      expect(canonicalJson(value)).toBeUndefined();
  });

  it('gives up past maxDepth (512 nested containers by default), not before', () => {
    const nested = (depth: number) => {
      let value: unknown = 1;
      for (let i = 0; i < depth; i++) value = [value];
      return value;
    };
    expect(canonicalJson(nested(512))).toBe(`${'['.repeat(512)}1${']'.repeat(512)}`);
    expect(canonicalJson(nested(513))).toBeUndefined();
    expect(canonicalJson({ a: [1] }, 2)).toBe('{"a":[1]}');
    expect(canonicalJson({ a: [[1]] }, 2)).toBeUndefined();
  });
});

describe('fingerprintRequest edges', () => {
  const base = { method: 'POST', route: '/charges/:id', path: '/charges/a', contentType: 'application/json' };

  it('tells apart consecutive requests that differ only in identity headers', () => {
    // Consecutive calls reuse the framing of the last one; that reuse must not skip the headers.
    const plain = fingerprintRequest({ ...base, body: '{"x":1}' });
    expect(fingerprintRequest({ ...base, body: '{"x":1}', headers: { 'X-Api-Version': '2' } })).not.toBe(plain);
  });

  it('skips query parameters given as undefined', () => {
    expect(fingerprintRequest({ ...base, query: { a: '1', b: undefined } })).toBe(
      fingerprintRequest({ ...base, query: 'a=1' }),
    );
  });

  it('unescapes a JSON Pointer as RFC 6901 says: ~01 names the member "~1", not "/"', () => {
    const fp = (body: string) => fingerprintRequest({ ...base, body }, { exclude: ['/a~01b'] });
    expect(fp('{"a~1b":1,"a/b":1}')).toBe(fp('{"a~1b":2,"a/b":1}'));
    expect(fp('{"a~1b":1,"a/b":1}')).not.toBe(fp('{"a~1b":1,"a/b":2}'));
  });

  it('a * token stands for every item of an array, and only of an array', () => {
    const fp = (body: unknown, exclude: string[]) => fingerprintRequest({ ...base, json: body }, { exclude });
    const lines = (refs: string[], skus = ['a', 'b']) => ({ lines: skus.map((sku, i) => ({ sku, ref: refs[i] })) });
    const each = ['/lines/*/ref'];
    expect(fp(lines(['x', 'y']), each)).toBe(fp(lines(['p', 'q']), each));
    expect(fp(lines(['x', 'y']), each)).not.toBe(fp(lines(['x', 'y'], ['a', 'c']), each));
    // Nested wildcards, and one at the end (which leaves an empty array, still not a missing one).
    const nested = (n: string) => ({ a: [{ b: [{ c: n, d: 1 }] }, { b: [{ c: n, d: 2 }] }] });
    expect(fp(nested('x'), ['/a/*/b/*/c'])).toBe(fp(nested('y'), ['/a/*/b/*/c']));
    expect(fp({ tags: ['t1'] }, ['/tags/*'])).toBe(fp({ tags: ['t2', 't3'] }, ['/tags/*']));
    expect(fp({ tags: ['t1'] }, ['/tags/*'])).not.toBe(fp({}, ['/tags/*']));
    // On an object, * is the member named "*".
    expect(fp({ m: { '*': 1, k: 1 } }, ['/m/*'])).toBe(fp({ m: { '*': 2, k: 1 } }, ['/m/*']));
    expect(fp({ m: { '*': 1, k: 1 } }, ['/m/*'])).not.toBe(fp({ m: { '*': 1, k: 2 } }, ['/m/*']));
  });

  it('an array token is an index as RFC 6901 writes one: no sign, no leading zero, not length', () => {
    const fp = (body: unknown, pointer: string) => fingerprintRequest({ ...base, json: body }, { exclude: [pointer] });
    expect(fp({ t: ['a', 'b'] }, '/t/1')).toBe(fp({ t: ['a', 'c'] }, '/t/1'));
    for (const pointer of ['/t/01', '/t/-1', '/t/length', '/t/2', '/t/1.0']) {
      expect(fp({ t: ['a', 'b'] }, pointer), pointer).not.toBe(fp({ t: ['a', 'c'] }, pointer));
    }
  });

  it('an exclusion that is not a JSON Pointer (no leading /) excludes nothing', () => {
    const fp = (body: string) => fingerprintRequest({ ...base, body }, { exclude: ['xamount'] });
    expect(fp('{"amount":1}')).not.toBe(fp('{"amount":2}'));
  });
});

// The body parsers decode a text body by its charset: the same bytes under two charsets are two
// texts the handler is given, so two requests. UTF-8, however it is spelled, and no charset at all
// are the one default, and fingerprint as before the charset was framed (stored records keep theirs).
describe('fingerprintRequest and the charset parameter', () => {
  const bytes = new Uint8Array([0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea]);
  const of = (contentType: string) =>
    fingerprintRequest({ method: 'POST', route: '/echo', path: '/echo', contentType, body: bytes });

  it('UTF-8 in any spelling, or none, is one request', () => {
    const plain = of('text/plain');
    for (const contentType of [
      'text/plain; charset=utf-8',
      'text/plain;charset=UTF-8',
      'text/plain; charset="utf-8"',
      'text/plain; charset=utf8',
      'text/plain; format=flowed',
    ])
      expect(of(contentType), contentType).toBe(plain);
  });

  it('another charset is another request, and its name is read case-insensitively, quoted or not', () => {
    const shiftJis = of('text/plain; charset=shift_jis');
    expect(shiftJis).not.toBe(of('text/plain'));
    expect(shiftJis).not.toBe(of('text/plain; charset=iso-8859-1'));
    expect(of('text/plain; charset="Shift_JIS"')).toBe(shiftJis);
    expect(of('text/plain; format=flowed; CHARSET=shift_jis')).toBe(shiftJis);
  });

  it('frames the charset apart from the media type: no media type spelling stands for it', () => {
    expect(of('text/plain; charset=x')).not.toBe(of('text/plainx'));
    expect(of('text/plain; charset=x')).not.toBe(of('text/plain; charset=x2'));
  });
});
