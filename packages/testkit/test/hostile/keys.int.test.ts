// Hostile Idempotency-Key headers against real Express, Fastify and Koa servers: every byte value,
// lengths 0 to 10,000, duplicated fields, sf-string edge cases, and fast-check fuzzing. Each answer
// is the one the documented parser (parseIdempotencyKey) implies: 201 for a valid key, 400 for any
// other, identical on the three adapters, never a 5xx, never a dropped connection, and quickly.
import { parseIdempotencyKey } from '@idem/core';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RawAnswer, rawRequest, sendRaw } from './raw-http.js';
import { type HostileServer, startAll } from './servers.js';

const limitMs = 5000;
let servers: HostileServer[];
let tried = 0;

beforeAll(async () => {
  servers = await startAll();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => server.close()));
  console.info(`[figures] hostile keys ${JSON.stringify({ inputs: tried, adapters: servers.length })}`);
});

const body = Buffer.from('{"amount":1}');

/** Sends one request with the given key field line(s) to every adapter. */
async function sendKey(fields: Buffer[]): Promise<RawAnswer[]> {
  tried++;
  const request = rawRequest({
    path: '/charges',
    headers: [
      ['Content-Type', 'application/json'],
      ...fields.map((field) => ['Idempotency-Key', field] as [string, Buffer]),
    ],
    body,
  });
  return Promise.all(servers.map((server) => sendRaw(server.port, request, limitMs)));
}

/** What the key parser says about a field value as the HTTP layer hands it over (latin1). */
const expectedFor = (fields: Buffer[]): number => {
  const values = fields.map((field) => field.toString('latin1'));
  return parseIdempotencyKey(values.length === 1 ? values[0] : values).ok ? 201 : 400;
};

// Bytes Node's HTTP parser refuses in a field value: the request gets the server's own 400 (Fastify
// words it as JSON) before any framework or idem code runs.
const parserRefuses = (fields: Buffer[]) =>
  fields.some((field) => field.some((b) => (b < 0x20 && b !== 0x09) || b === 0x7f));

const check = (answers: RawAnswer[], expected: number | readonly number[], label: string, fields: Buffer[] = []) => {
  const allowed = typeof expected === 'number' ? [expected] : expected;
  for (const [i, answer] of answers.entries()) {
    const where = `${servers[i]!.name}: ${label}`;
    expect(answer.timedOut, where).toBe(false);
    expect(answer.ms, where).toBeLessThan(limitMs);
    expect(allowed, `${where} got ${answer.status}`).toContain(answer.status);
    // Refused by idem itself: a problem document with a stable code.
    if (answer.status === 400 && !parserRefuses(fields)) {
      expect(answer.headers['content-type'], where).toMatch(/^application\/problem\+json/);
      expect(JSON.parse(answer.body).code, where).toMatch(/^key_(invalid|missing)$/);
    }
  }
  // One table, three frameworks: the same input gets the same status everywhere.
  expect(new Set(answers.map((a) => a.status)).size, label).toBe(1);
};

describe('hostile Idempotency-Key values', () => {
  it("every byte value, alone and inside a key, gives the parser's answer", async () => {
    for (let byte = 0; byte < 256; byte++) {
      if (byte === 0x0d || byte === 0x0a) continue; // line breaks end the field: see the framing test
      for (const field of [
        Buffer.from([byte]),
        Buffer.concat([Buffer.from('key-'), Buffer.from([byte]), Buffer.from('-x')]),
      ]) {
        check(await sendKey([field]), expectedFor([field]), `byte 0x${byte.toString(16)}`, [field]);
      }
    }
  });

  it('lengths from 0 to 10,000 bytes: 1 to 255 accepted, the rest refused', async () => {
    for (const length of [0, 1, 2, 254, 255, 256, 257, 1000, 4096, 8192, 10_000]) {
      const field = Buffer.from('k'.repeat(length));
      check(await sendKey([field]), length >= 1 && length <= 255 ? 201 : 400, `length ${length}`);
      const quoted = Buffer.from(`"${'q'.repeat(length)}"`);
      check(await sendKey([quoted]), length >= 1 && length <= 255 ? 201 : 400, `sf-string length ${length}`);
    }
  });

  it('duplicated fields and lists are refused', async () => {
    const corpus: Buffer[][] = [
      [Buffer.from('a'), Buffer.from('a')],
      [Buffer.from('a'), Buffer.from('b')],
      [Buffer.from('"a"'), Buffer.from('"a"')],
      [Buffer.from('a, b')],
      [Buffer.from('"a", "b"')],
      [Buffer.from('a,')],
      [Buffer.from(',a')],
    ];
    for (const fields of corpus) check(await sendKey(fields), 400, fields.map(String).join(' | '));
  });

  it('sf-string edge cases follow RFC 9651', async () => {
    const corpus: Array<[string, number]> = [
      ['"abc"', 201],
      ['"a b"', 201],
      ['" "', 400], // only whitespace
      ['""', 400], // empty
      ['"abc', 400], // unterminated
      ['abc"', 400],
      ['"a\\"b"', 201], // escaped quote
      ['"a\\\\b"', 201], // escaped backslash
      ['"a\\b"', 400], // bad escape
      ['"abc";p=1', 201], // parameters are ignored
      ['"abc";P=1', 400], // parameter names are lower case
      ['"abc";p="x"', 201],
      ['"abc";p=?1', 201],
      ['"abc" ;p=1', 400],
      ['"abc"x', 400], // trailing garbage
      ['"abc"   ', 201], // trailing whitespace is not part of the field
      ['   abc', 201],
      ['"\u00e9"', 400], // non-ASCII inside a string
      ['a;b', 400],
      ['a\\b', 400],
      ['\t"abc"\t', 201],
    ];
    for (const [value, expected] of corpus) {
      const field = Buffer.from(value, 'latin1');
      expect(expectedFor([field]), `oracle for ${value}`).toBe(expected);
      check(await sendKey([field]), expected, value, [field]);
    }
  });

  it('a line break inside the value is a framing attack: never a 5xx, never a second key', async () => {
    for (const value of ['a\r\nIdempotency-Key: b', 'a\nX-Other: 1', 'a\r\n\r\nGET / HTTP/1.1', 'a\rb']) {
      const answers = await sendKey([Buffer.from(value, 'latin1')]);
      for (const answer of answers) {
        expect(answer.timedOut).toBe(false);
        expect(answer.status === 0 || answer.status < 500, `${value}: ${answer.status}`).toBe(true);
      }
    }
  });

  it("fast-check: random bytes and random printable keys get the parser's answer on every adapter", async () => {
    const printable = fc.string({
      unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
      maxLength: 300,
    });
    const noBreaks = fc
      .uint8Array({ maxLength: 400 })
      .map((bytes) => Buffer.from(bytes.filter((b) => b !== 0x0d && b !== 0x0a)));
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          noBreaks,
          printable.map((s) => Buffer.from(s, 'latin1')),
          printable.map((s) => Buffer.from(`"${s}"`, 'latin1')),
        ),
        async (field) => {
          check(await sendKey([field]), expectedFor([field]), JSON.stringify(field.toString('latin1')), [field]);
        },
      ),
      { numRuns: 150 },
    );
  });

  it('the same valid key replays instead of running again, on every adapter', async () => {
    const before = servers.map((s) => s.runs.charges);
    const field = Buffer.from('"replay-me"');
    check(await sendKey([field]), 201, 'first');
    const again = await sendKey([field]);
    check(again, 201, 'again');
    for (const answer of again) expect(answer.headers['idempotent-replayed']).toBe('true');
    expect(servers.map((s) => s.runs.charges)).toEqual(before.map((n) => n + 1));
  });
});
