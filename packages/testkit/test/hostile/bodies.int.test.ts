// Hostile request bodies against real Express, Fastify and Koa servers with idempotency(): huge
// (declared and chunked), deeply nested JSON, invalid UTF-8, content types that lie, and fast-check
// garbage. Each gets a 4xx the docs name (413 over the limit, before any hashing or claim; the
// framework's own 400/415 for what its parser refuses, stored and replayed like any outcome) or a
// success, never a 5xx, a hang or a crash; and a retry with the same key never runs the handler again.
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import fc from 'fast-check';
import Fastify from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RawAnswer, rawRequest, sendRaw } from './raw-http.js';
import { type HostileServer, maxBodyBytes, startAll } from './servers.js';

const limitMs = 5000;
let servers: HostileServer[];
let tried = 0;

beforeAll(async () => {
  servers = await startAll();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => server.close()));
  console.info(`[figures] hostile bodies ${JSON.stringify({ inputs: tried, adapters: servers.length })}`);
});

interface BodyCase {
  contentType?: string;
  body: Buffer;
  /** Send chunked, without Content-Length. */
  chunked?: boolean;
  /** Declare this Content-Length (the body sent is what it is). */
  declared?: number;
  extraHeaders?: Array<[string, string]>;
}

function build(input: BodyCase, key: string): Buffer {
  const headers: Array<[string, string]> = [['Idempotency-Key', key], ...(input.extraHeaders ?? [])];
  if (input.contentType !== undefined) headers.push(['Content-Type', input.contentType]);
  if (!input.chunked) {
    const options: Parameters<typeof rawRequest>[0] = { path: '/charges', headers, body: input.body };
    if (input.declared !== undefined) options.contentLength = input.declared;
    return rawRequest(options);
  }
  headers.push(['Transfer-Encoding', 'chunked']);
  const chunks: Buffer[] = [];
  for (let at = 0; at < input.body.length; at += 16_384) {
    const piece = input.body.subarray(at, at + 16_384);
    chunks.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'));
  }
  chunks.push(Buffer.from('0\r\n\r\n'));
  return rawRequest({ path: '/charges', headers, body: Buffer.concat(chunks), contentLength: false });
}

/** Sends the case to one server twice with one key; checks the answers and that nothing ran twice. */
async function throwAt(server: HostileServer, input: BodyCase, allowed: readonly number[], label: string) {
  tried++;
  const key = randomUUID();
  const before = server.runs.charges;
  const first = await sendRaw(server.port, build(input, key), limitMs);
  const where = `${server.name}: ${label}`;
  expectBounded(first, allowed, where);
  const ran = server.runs.charges - before;
  expect(ran, where).toBeLessThanOrEqual(1);
  if (first.status === 413) {
    expect(ran, `${where}: 413 comes before the handler`).toBe(0);
    expect(first.headers['content-type'], where).toMatch(/^application\/problem\+json/);
    return first;
  }
  const again = await sendRaw(server.port, build(input, key), limitMs);
  expectBounded(again, [first.status], `${where} (retry)`);
  expect(server.runs.charges - before, `${where}: the retry never runs the handler again`).toBe(ran);
  return first;
}

function expectBounded(answer: RawAnswer, allowed: readonly number[], where: string) {
  expect(answer.timedOut, where).toBe(false);
  expect(answer.ms, where).toBeLessThan(limitMs);
  expect(allowed, `${where} got ${answer.status}`).toContain(answer.status);
}

const json = 'application/json';
const deep = (depth: number) => Buffer.from(`${'['.repeat(depth)}${']'.repeat(depth)}`);
const deepObject = (depth: number) => Buffer.from(`${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`);

describe('hostile request bodies', () => {
  it('bodies over the limit get 413 before hashing or claiming, declared or chunked', async () => {
    const huge = Buffer.alloc(2 * 1024 * 1024, 0x61);
    for (const server of servers) {
      await throwAt(server, { contentType: json, body: huge }, [413], '2 MiB with Content-Length');
      await throwAt(server, { contentType: json, body: huge, chunked: true }, [413], '2 MiB chunked');
      await throwAt(server, { contentType: json, body: Buffer.alloc(maxBodyBytes + 1, 0x20) }, [413], 'limit + 1');
    }
  });

  // Every reader compares the declared Content-Length with maxBodyBytes before reading a byte (on
  // Fastify too, in its preParsing hook, before Fastify's own bodyLimit check): a client that
  // declares 10 GB and sends two bytes would otherwise hold the request open until requestTimeout.
  it('a Content-Length over the limit is refused on the declaration alone, without waiting for the bytes', async () => {
    for (const server of servers) {
      await throwAt(
        server,
        { contentType: json, body: Buffer.from('{}'), declared: 10 * 1024 ** 3 },
        [413],
        '10 GB declared',
      );
    }
  });

  it('deeply nested JSON is hashed as bytes and parsed (or refused) by the framework, never a stack overflow', async () => {
    for (const server of servers) {
      for (const body of [deep(20_000), deepObject(10_000), deep(600), deepObject(513)]) {
        await throwAt(server, { contentType: json, body }, [201, 400], `nesting of ${body.length} bytes`);
      }
    }
  });

  it('invalid UTF-8, wrong and absent content types, bad encodings', async () => {
    const cases: Array<[string, BodyCase, readonly number[]]> = [
      [
        'invalid UTF-8 in a JSON string',
        { contentType: json, body: Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0xc3, 0x22, 0x7d]) },
        [201, 400],
      ],
      ['lone surrogate escapes', { contentType: json, body: Buffer.from('{"a":"\\ud800\\udfff\\udc00"}') }, [201, 400]],
      ['binary garbage as JSON', { contentType: json, body: Buffer.from([0, 1, 2, 0xff, 0x80, 0x7b]) }, [400]],
      ['JSON as text/plain', { contentType: 'text/plain', body: Buffer.from('{"amount":1}') }, [201, 415]],
      ['JSON without a content type', { body: Buffer.from('{"amount":1}') }, [201, 415]],
      [
        'an unknown charset',
        { contentType: 'application/json; charset=utf-99', body: Buffer.from('{}') },
        [201, 400, 415],
      ],
      [
        'a content type of 4 KB',
        { contentType: `application/json; x=${'a'.repeat(4096)}`, body: Buffer.from('{}') },
        [201, 400, 415],
      ],
      ['an empty JSON body', { contentType: json, body: Buffer.alloc(0) }, [201, 400]],
      [
        'gzip that is not gzip',
        { contentType: json, body: Buffer.from('not gzip'), extraHeaders: [['Content-Encoding', 'gzip']] },
        [201, 400, 415],
      ],
      [
        'JSON with duplicate keys',
        { contentType: json, body: Buffer.from('{"a":1,"a":2,"__proto__":{"x":1}}') },
        [201, 400],
      ],
      ['a number of 100k digits', { contentType: json, body: Buffer.from(`{"n":${'9'.repeat(60_000)}}`) }, [201, 400]],
    ];
    for (const server of servers) {
      for (const [label, input, allowed] of cases) await throwAt(server, input, allowed, label);
    }
  });

  it('the same key with another body is 422, never the first answer', async () => {
    for (const server of servers) {
      const key = randomUUID();
      const first = await sendRaw(server.port, build({ contentType: json, body: Buffer.from('{"amount":1}') }, key));
      expect(first.status).toBe(201);
      const other = await sendRaw(server.port, build({ contentType: json, body: Buffer.from('{"amount":2}') }, key));
      expect(other.status, server.name).toBe(422);
      expect(JSON.parse(other.body).code).toBe('fingerprint_mismatch');
    }
  });

  // A JSON number literal too large for a double (`1e400`) parses to Infinity. The canonical form
  // once wrote a non-finite number as `null`, as JSON.stringify does: `{"amount":null}`,
  // `{"amount":1e400}` and `{"amount":-1e400}` fingerprinted alike, and the second request under the
  // first's key got the first's 201 as a replay though its handler saw another value. DESIGN, HTTP
  // table: same key, other request is 422.
  it('a number that overflows to Infinity is another request than null: 422, not a replay', async () => {
    for (const server of servers) {
      for (const [first, second] of [
        ['{"amount":null}', '{"amount":1e400}'],
        ['{"amount":1e400}', '{"amount":-1e400}'],
      ] as const) {
        const key = randomUUID();
        const one = await sendRaw(server.port, build({ contentType: json, body: Buffer.from(first) }, key));
        expect(one.status, `${server.name}: ${first}`).toBe(201);
        const other = await sendRaw(server.port, build({ contentType: json, body: Buffer.from(second) }, key));
        expect(other.status, `${server.name}: ${second} after ${first}`).toBe(422);
      }
    }
  });

  // An integer past 2^53 keeps its digits where idem reads the bytes (Express and Koa, mounted
  // before the parser): two amounts a double cannot tell apart are two requests, 422. Fastify
  // fingerprints what its parser made of the body, and its default parser has rounded both to one
  // double, the value its handler sees: one request, a replay (docs/concepts.md). A Fastify
  // instance whose JSON parser keeps such integers exact (as bigints) answers as the others do,
  // which is what a route served by adapters of both kinds on one store needs (docs/guides/fastify.md).
  it('an integer past 2^53 is kept exact from bytes, and on Fastify as exact as its parser keeps it', async () => {
    const twoAmounts = async (port: number) => {
      const key = randomUUID();
      const one = await sendRaw(port, build({ contentType: json, body: Buffer.from('{"n":9007199254740993}') }, key));
      expect(one.status).toBe(201);
      const other = await sendRaw(port, build({ contentType: json, body: Buffer.from('{"n":9007199254740992}') }, key));
      return other.status;
    };
    const answers: Record<string, number> = {};
    for (const server of servers) answers[server.name] = await twoAmounts(server.port);
    expect(answers).toEqual({ express: 422, fastify: 201, koa: 422 });

    const app = Fastify();
    const exactIntegers = (_key: string, value: unknown, context?: { source?: string }) =>
      typeof value === 'number' && !Number.isSafeInteger(value) && /^-?\d+$/.test(context?.source ?? '')
        ? BigInt(context?.source as string)
        : value;
    app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
      try {
        done(null, JSON.parse(body as string, exactIntegers));
      } catch (error) {
        done(Object.assign(error as Error, { statusCode: 400 }), undefined);
      }
    });
    await app.register(fastifyIdempotency, { store: memoryStore(), scope: () => 'exact' });
    app.post('/charges', async (_request, reply) => reply.code(201).send({ ok: true }));
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      expect(await twoAmounts((app.server.address() as AddressInfo).port)).toBe(422);
    } finally {
      await app.close();
    }
  });

  it('fast-check: random bytes under random content types are answered below 500, and once', async () => {
    const contentType = fc.constantFrom(
      json,
      'text/plain',
      'application/octet-stream',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      undefined,
    );
    await fc.assert(
      fc.asyncProperty(fc.uint8Array({ maxLength: 2048 }), contentType, fc.nat(2), async (bytes, type, index) => {
        const input: BodyCase = { body: Buffer.from(bytes) };
        if (type !== undefined) input.contentType = type;
        await throwAt(servers[index]!, input, [201, 400, 415], `${type} ${bytes.length} bytes`);
      }),
      { numRuns: 120 },
    );
  });
});
