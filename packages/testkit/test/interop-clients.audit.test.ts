// Real clients that are not Node (curl, Python's http.client) against the three adapters over one
// memoryStore: what they receive must be the HTTP table of DESIGN.md ("one table, shared by every
// adapter"), identical on Express, Fastify and Koa, whatever HTTP version, framing or spelling the
// client uses.
import { randomBytes, randomUUID } from 'node:crypto';
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CurlAnswer,
  curl,
  frameworkNames,
  hasCurl,
  hasPython,
  python,
  type Servers,
  startServers,
  tempFile,
  tokenFor,
} from './audit-support/interop-clients.js';

let servers: Servers;
beforeAll(async () => {
  servers = await startServers(memoryStore());
});
afterAll(async () => {
  await servers?.close();
});

const auth = (): string[] => ['-H', `Authorization: Bearer ${tokenFor('user-1')}`];
const url = (framework: (typeof frameworkNames)[number], path: string) =>
  `http://127.0.0.1:${servers.ports[framework]}${path}`;
const post = (key: string, ...rest: string[]) => ['-X', 'POST', ...auth(), '-H', `Idempotency-Key: ${key}`, ...rest];

function expectReplay(answer: CurlAnswer, first: CurlAnswer, key: string) {
  expect(answer.exit).toBe(0);
  expect(answer.status).toBe(first.status);
  expect(answer.body.equals(first.body)).toBe(true);
  expect(answer.headers['idempotent-replayed']).toBe('true');
  expect(answer.headers['cache-control']).toBe('no-store');
  expect(answer.headers['idempotency-key']).toBe(key);
}

function expectProblem(answer: CurlAnswer, status: number, code: string) {
  expect(answer.status).toBe(status);
  expect(answer.headers['content-type']).toBe('application/problem+json');
  expect(answer.headers['cache-control']).toBe('no-store');
  const problem = JSON.parse(answer.body.toString()) as Record<string, unknown>;
  expect(problem).toMatchObject({ status, code });
  expect(typeof problem.type).toBe('string');
  expect(typeof problem.title).toBe('string');
}

describe.skipIf(!hasCurl).each(frameworkNames)('curl against %s', (framework) => {
  it('a response streamed (chunked) to an HTTP/1.1 client replays to an HTTP/1.0 one with Content-Length, then the connection closes', async () => {
    const key = randomUUID();
    const first = await curl([...post(key, '--http1.1', '-d', 'x=1'), url(framework, '/stream')]);
    expect(first.exit).toBe(0);
    expect(first.headers['transfer-encoding']).toBe('chunked');
    expect(first.headers['idempotency-key']).toBe(key);
    const old = await curl([...post(key, '--http1.0', '-d', 'x=1'), url(framework, '/stream')]);
    expectReplay(old, first, key);
    expect(old.headers['content-length']).toBe(String(first.body.length));
    expect(old.headers['transfer-encoding']).toBeUndefined();
    expect(old.headers.connection).toBe('close');
    expect(old.trace).toContain('Closing connection');
  });

  it('a streamed first answer to HTTP/1.0 (close-delimited) is stored whole and replays to HTTP/1.1 with Content-Length', async () => {
    const key = randomUUID();
    const first = await curl([...post(key, '--http1.0', '-d', 'x=1'), url(framework, '/stream')]);
    expect(first.exit).toBe(0);
    expect(first.headers['transfer-encoding']).toBeUndefined();
    expect(first.body.toString()).toMatch(/part three\n$/);
    const again = await curl([...post(key, '--http1.1', '-d', 'x=1'), url(framework, '/stream')]);
    expectReplay(again, first, key);
    expect(again.headers['content-length']).toBe(String(first.body.length));
  });

  it('--compressed: gzip stored; a retry without Accept-Encoding gets it decoded, one with --compressed over HTTP/1.0 gets gzip', async () => {
    const key = randomUUID();
    const first = await curl([...post(key, '--compressed', '-d', 'x=1'), url(framework, '/gz')]);
    expect(first.headers['content-encoding']).toBe('gzip');
    const plain = await curl([...post(key, '-d', 'x=1'), url(framework, '/gz')]);
    expect(plain.status).toBe(201);
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.body.equals(first.body)).toBe(true); // curl decoded the first; the replay came decoded
    expect(plain.headers['content-length']).toBe(String(first.body.length));
    const old = await curl([...post(key, '--http1.0', '--compressed', '-d', 'x=1'), url(framework, '/gz')]);
    expectReplay(old, first, key);
    expect(old.headers['content-encoding']).toBe('gzip');
  });

  it('a body over 1 MiB (curl sends Expect: 100-continue) is 413 problem+json and leaves the key free; binary and chunked (-T -) uploads replay', async () => {
    const key = randomUUID();
    const big = await tempFile(randomBytes(1_200_000));
    const bytes = randomBytes(400_000);
    const mid = await tempFile(bytes);
    try {
      const refused = await curl([
        ...post(key, '-H', 'Content-Type: application/octet-stream', '--data-binary', `@${big.path}`),
        url(framework, '/charges'),
      ]);
      expect(refused.trace).toContain('Expect: 100-continue');
      expect(refused.exit).toBe(0);
      expectProblem(refused, 413, 'body_too_large');
      const first = await curl([
        ...post(key, '-H', 'Content-Type: application/octet-stream', '--data-binary', `@${mid.path}`),
        url(framework, '/charges'),
      ]);
      expect(first.status).toBe(201);
      const seen = JSON.parse(first.body.toString()) as { length: number; sha: string };
      expect(seen.length).toBe(bytes.length);
      const chunked = await curl(
        [...post(key, '-H', 'Content-Type: application/octet-stream', '-T', '-'), url(framework, '/charges')],
        bytes,
      );
      expect(chunked.trace).toContain('Transfer-Encoding: chunked');
      expectReplay(chunked, first, key);
      const flipped = Buffer.from(bytes);
      flipped[0] = (flipped[0] as number) ^ 1;
      const other = await curl(
        [...post(key, '-H', 'Content-Type: application/octet-stream', '-T', '-'), url(framework, '/charges')],
        flipped,
      );
      expectProblem(other, 422, 'fingerprint_mismatch');
    } finally {
      await big.remove();
      await mid.remove();
    }
  });

  it('header names in odd case, the key as sf-string or token, and surrounding blanks are one key', async () => {
    const key = `k-${randomUUID()}`;
    const send = (header: string) =>
      curl([...auth(), '-X', 'POST', '-H', header, '-d', 'a=1', url(framework, '/charges')]);
    const first = await send(`iDEMPOTENCY-kEY: ${key}`);
    expect(first.status).toBe(201);
    for (const header of [
      `IDEMPOTENCY-KEY: "${key}"`,
      `idempotency-key:    ${key}   `,
      `Idempotency-Key: "${key}";v=1`,
    ]) {
      const again = await send(header);
      expect(again.status, header).toBe(201);
      expect(again.body.equals(first.body), header).toBe(true);
      expect(again.headers['idempotent-replayed'], header).toBe('true');
    }
  });

  it('duplicate Idempotency-Key headers, a bare key with a space or a quote: 400 key_invalid; a quoted key with spaces works', async () => {
    const send = (...headers: string[]) =>
      curl([...auth(), '-X', 'POST', ...headers.flatMap((h) => ['-H', h]), '-d', 'a=1', url(framework, '/charges')]);
    const before = servers.runs();
    expectProblem(await send('Idempotency-Key: a1', 'Idempotency-Key: b1'), 400, 'key_invalid');
    expectProblem(await send('Idempotency-Key: same', 'Idempotency-Key: same'), 400, 'key_invalid');
    expectProblem(await send('Idempotency-Key: has space'), 400, 'key_invalid');
    expectProblem(await send('Idempotency-Key: ab"c'), 400, 'key_invalid');
    expectProblem(await send('Idempotency-Key;'), 400, 'key_invalid');
    expectProblem(await send(), 400, 'key_missing');
    expect(servers.runs()).toBe(before);
    const spaced = `"order ${randomUUID()} of 'today'"`;
    const first = await send(`Idempotency-Key: ${spaced}`);
    expect(first.status).toBe(201);
    expect(first.headers['idempotency-key']).toBe(spaced);
    expectReplay(await send(`Idempotency-Key: ${spaced}`), first, spaced);
  });

  it('first still running: 409 + Retry-After problem+json, also to an HTTP/1.0 client; then a replay', async () => {
    const own = await startServers(memoryStore());
    try {
      const key = randomUUID();
      const target = `http://127.0.0.1:${own.ports[framework]}/slow`;
      const running = curl([...post(key, '-d', 'x'), target]);
      await own.slowStarted();
      const busy = await curl([...post(key, '--http1.0', '-d', 'x'), target]);
      expectProblem(busy, 409, 'in_progress');
      expect(busy.headers['retry-after']).toMatch(/^\d+$/);
      own.open();
      const first = await running;
      expect(first.status).toBe(201);
      expectReplay(await curl([...post(key, '-d', 'x'), target]), first, key);
      expect(own.runs()).toBe(1);
    } finally {
      await own.close();
    }
  });

  // Fastify hung on it (packages/fastify/test/empty-chunked-body.audit.test.ts).
  it('an empty chunked body (curl -T - from an empty stdin) is answered and replays', async () => {
    const key = randomUUID();
    const first = await curl([...post(key, '-H', 'Content-Type: text/plain', '-T', '-'), url(framework, '/charges')]);
    expect(first.exit).toBe(0);
    expect(first.status).toBe(201);
    expect(JSON.parse(first.body.toString())).toMatchObject({ length: 0 });
    expectReplay(
      await curl([...post(key, '-H', 'Content-Type: text/plain', '-T', '-'), url(framework, '/charges')]),
      first,
      key,
    );
  });

  it('204 replays as 204 without a body, over HTTP/1.0 and 1.1', async () => {
    const key = randomUUID();
    const first = await curl([...post(key, '-d', 'x'), url(framework, '/empty')]);
    expect(first.status).toBe(204);
    for (const version of ['--http1.0', '--http1.1']) {
      const again = await curl([...post(key, version, '-d', 'x'), url(framework, '/empty')]);
      expectReplay(again, first, key);
      expect(again.headers.etag).toBe(first.headers.etag);
    }
  });
});

describe.skipIf(!hasCurl)('curl: the same answers, header for header, on the three frameworks', () => {
  // What a client compares: status, the table's headers, the problem body.
  const tableOf = (answer: CurlAnswer) => ({
    status: answer.status,
    'content-type': answer.headers['content-type'],
    'cache-control': answer.headers['cache-control'],
    'retry-after': answer.headers['retry-after'],
    'idempotent-replayed': answer.headers['idempotent-replayed'],
    body: answer.headers['content-type']?.startsWith('application/problem+json') ? answer.body.toString() : undefined,
  });
  it('missing key, malformed key, mismatch and over-limit are byte-identical problems', async () => {
    const seen: Record<string, unknown[]> = {};
    for (const framework of frameworkNames) {
      const key = randomUUID();
      await curl([...post(key, '-d', 'a=1'), url(framework, '/charges')]);
      const answers = [
        await curl([...auth(), '-X', 'POST', '-d', 'a=1', url(framework, '/charges')]),
        await curl([...post('a b'), '-d', 'a=1', url(framework, '/charges')]),
        await curl([...post(key, '-d', 'a=2'), url(framework, '/charges')]),
        await curl([...post(randomUUID(), '-H', 'Content-Length: 2000000'), url(framework, '/charges')]),
      ];
      seen[framework] = answers.map(tableOf);
    }
    expect(seen.fastify).toEqual(seen.express);
    expect(seen.koa).toEqual(seen.express);
  });
});

describe.skipIf(!hasPython).each(frameworkNames)('Python http.client against %s', (framework) => {
  const headers = (key: string, contentType?: string): Array<[string, string]> => [
    ['Authorization', `Bearer ${tokenFor('user-1')}`],
    ['Idempotency-Key', key],
    ...(contentType === undefined ? [] : ([['Content-Type', contentType]] as Array<[string, string]>)),
  ];
  const body = Buffer.from('{"amount": 1000, "note": "café"}');

  it('a JSON body chunked one byte at a time, retried whole with the key as an sf-string, replays; without Content-Type it is another request', async () => {
    const key = `py-${randomUUID()}`;
    const [first, quoted, untyped] = await python(servers.ports[framework], [
      {
        path: '/charges',
        headers: headers(key, 'application/json'),
        chunked: true,
        chunks: [...body].map((b) => Buffer.from([b])),
      },
      { path: '/charges', headers: headers(`"${key}"`, 'application/json'), chunks: [body] },
      { path: '/charges', headers: headers(key), chunks: [body] },
    ]);
    expect(first?.status).toBe(201);
    expect(JSON.parse(String(first?.body))).toMatchObject({ length: body.length });
    expect(quoted?.status).toBe(201);
    expect(quoted?.headers['idempotent-replayed']).toBe('true');
    expect(quoted?.headers['idempotency-key']).toBe(`"${key}"`);
    expect(quoted?.body.equals(first?.body as Buffer)).toBe(true);
    expect(untyped?.status).toBe(422);
    expect(untyped?.headers['content-type']).toBe('application/problem+json');
  });

  it('a request without Content-Type runs once and replays to the same request', async () => {
    const key = `py-${randomUUID()}`;
    const [first, again] = await python(servers.ports[framework], [
      { path: '/charges', headers: headers(key), chunks: [body] },
      { path: '/charges', headers: headers(key), chunks: [body] },
    ]);
    expect(first?.status).toBe(201);
    expect(again?.headers['idempotent-replayed']).toBe('true');
    expect(again?.body.equals(first?.body as Buffer)).toBe(true);
  });

  it('a body sent slowly in small chunks is read whole; HTTP/1.0 with Connection: keep-alive gets a replay with Content-Length on a connection kept open', async () => {
    const key = `py-${randomUUID()}`;
    const pieces: Buffer[] = [];
    for (let i = 0; i < body.length; i += 5) pieces.push(body.subarray(i, i + 5));
    const [slow] = await python(servers.ports[framework], [
      { path: '/charges', headers: headers(key, 'application/json'), chunked: true, chunks: pieces, pause: 0.02 },
    ]);
    expect(slow?.status).toBe(201);
    expect(JSON.parse(String(slow?.body))).toMatchObject({ length: body.length });
    const keepAlive: Array<[string, string]> = [...headers(key, 'application/json'), ['Connection', 'keep-alive']];
    const answers = await python(
      servers.ports[framework],
      [
        { path: '/charges', headers: keepAlive, chunks: [body] },
        { path: '/charges', headers: keepAlive, chunks: [body] },
      ],
      true,
    );
    expect(answers).toHaveLength(2);
    for (const answer of answers) {
      expect(answer.status).toBe(201);
      expect(answer.headers['idempotent-replayed']).toBe('true');
      expect(answer.headers.connection).toBe('keep-alive');
      expect(answer.headers['content-length']).toBe(String(slow?.body.length));
      expect(answer.body.equals(slow?.body as Buffer)).toBe(true);
    }
  });
});
