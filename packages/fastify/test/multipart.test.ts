// @fastify/multipart for real behind the plugin, in both of its modes: the handler reads the upload
// itself (`request.file()`, `request.parts()`, `request.saveRequestFiles()`), and
// `attachFieldsToBody: true` (parsed in a `preValidation` hook, before the key is claimed). Every way
// it refuses a request's own upload (a limit over, a malformed body, a request that is no multipart)
// must leave the key free, so the retry with the upload fixed runs; koa/test/bodyparser.test.ts and
// the multer cases of express.test.ts do the same for the other frameworks' parsers.
import { Buffer } from 'node:buffer';
import type { AddressInfo } from 'node:net';
import multipart from '@fastify/multipart';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import { transactionalMemoryStore } from '@idem/testkit';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// Small limits, so each is over with a few bytes.
const limits = { fileSize: 100, files: 2, fields: 3, parts: 4, fieldSize: 20 };

const boundary = 'idem-fastify-boundary';

type Part =
  | { name: string; value: string; type?: string }
  | { name: string; file: Buffer; filename?: string; type?: string };

// A multipart/form-data body of `parts` under `boundary`.
function form(parts: Part[], under = boundary): Buffer {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    if ('file' in part) {
      chunks.push(
        Buffer.from(
          `--${under}\r\nContent-Disposition: form-data; name="${part.name}"; filename="${part.filename ?? 'receipt.bin'}"\r\n` +
            `Content-Type: ${part.type ?? 'application/octet-stream'}\r\n\r\n`,
        ),
        part.file,
        Buffer.from('\r\n'),
      );
    } else {
      const type = part.type === undefined ? '' : `Content-Type: ${part.type}\r\n`;
      chunks.push(
        Buffer.from(
          `--${under}\r\nContent-Disposition: form-data; name="${part.name}"\r\n${type}\r\n${part.value}\r\n`,
        ),
      );
    }
  }
  chunks.push(Buffer.from(`--${under}--\r\n`));
  return Buffer.concat(chunks);
}

const multipartType = `multipart/form-data; boundary=${boundary}`;
const file = (size: number, name = 'receipt'): Part => ({ name, file: Buffer.alloc(size, 7) });

interface Sent {
  headers: Record<string, string>;
  body: Buffer;
}

const upload = (parts: Part[]): Sent => ({ headers: { 'content-type': multipartType }, body: form(parts) });

// The upload every refused request is fixed to: a note and one small file.
const fixed = upload([{ name: 'note', value: 'hello' }, file(50)]);

interface Refused extends Sent {
  name: string;
  /** What @fastify/multipart's refusal is answered with. */
  status: number;
}

// What @fastify/multipart refuses in a request's own upload, whatever reads it.
const refusals: Refused[] = [
  // FST_REQ_FILE_TOO_LARGE, raised where the file is read (its `throwFileSizeLimit` is on by default).
  { name: 'a file over fileSize', ...upload([{ name: 'note', value: 'hello' }, file(500)]), status: 413 },
  // FST_FILES_LIMIT: a third file.
  { name: 'files over the limit', ...upload([file(10, 'a'), file(10, 'b'), file(10, 'c')]), status: 413 },
  // FST_FIELDS_LIMIT: a fourth field.
  {
    name: 'fields over the limit',
    ...upload(['a', 'b', 'c', 'd'].map((name) => ({ name, value: 'x' }))),
    status: 413,
  },
  // FST_PARTS_LIMIT: a fifth part.
  {
    name: 'parts over the limit',
    ...upload([
      { name: 'a', value: 'x' },
      { name: 'b', value: 'x' },
      { name: 'c', value: 'x' },
      file(10, 'd'),
      file(10, 'e'),
    ]),
    status: 413,
  },
  // FST_INVALID_JSON_FIELD_ERROR: a JSON field over fieldSize is cut, and so never valid JSON.
  {
    name: 'a JSON field over fieldSize',
    ...upload([{ name: 'meta', value: `{"note":"${'x'.repeat(40)}"}`, type: 'application/json' }, file(10)]),
    status: 406,
  },
  {
    name: 'a JSON field that is no JSON',
    ...upload([{ name: 'meta', value: '{"note":', type: 'application/json' }, file(10)]),
    status: 406,
  },
  // FST_PROTO_VIOLATION.
  { name: 'a field named __proto__', ...upload([{ name: '__proto__', value: 'x' }, file(10)]), status: 400 },
  // busboy's own errors carry no status: Fastify answers 500.
  {
    name: 'a body cut short',
    headers: { 'content-type': multipartType },
    body: form([{ name: 'note', value: 'hello' }, file(50)]).subarray(0, 150),
    status: 500,
  },
  {
    name: 'a body under another boundary',
    headers: { 'content-type': multipartType },
    body: form([{ name: 'note', value: 'hello' }, file(50)], 'another-boundary'),
    status: 500,
  },
  {
    name: 'no boundary',
    headers: { 'content-type': 'multipart/form-data' },
    body: form([{ name: 'note', value: 'hello' }, file(50)]),
    status: 500,
  },
];

// FST_INVALID_MULTIPART_CONTENT_TYPE: the handler asks for the upload of a request that is no
// multipart (the mode in which the handler reads it; with attachFieldsToBody it is the route's
// body schema that refuses it, in validation).
const notMultipart: Refused = {
  name: 'a JSON body',
  headers: { 'content-type': 'application/json' },
  body: Buffer.from('{"note":"hello"}'),
  status: 406,
};

interface Server {
  url: string;
  runs: () => number;
  events: IdempotencyEvent[];
  app: FastifyInstance;
}

async function start(
  options: { attachFieldsToBody?: boolean; transactional?: boolean },
  routes: (app: FastifyInstance, ran: () => number) => void,
): Promise<Server> {
  const events: IdempotencyEvent[] = [];
  const app = Fastify();
  const { transactional = false, ...multipartOptions } = options;
  await app.register(idempotency, {
    store: transactional ? transactionalMemoryStore() : memoryStore(),
    transactional,
    scope: () => 'tenant-1',
    onEvent: (event) => events.push(event),
  });
  await app.register(multipart, { limits, ...multipartOptions });
  let runs = 0;
  routes(app, () => ++runs);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, runs: () => runs, events, app };
}

// Each key as a token: its text, with what a token cannot hold taken out.
const send = (url: string, key: string, sent: Sent) =>
  fetch(url, {
    method: 'POST',
    headers: { ...sent.headers, 'idempotency-key': key.replace(/[^A-Za-z0-9_-]+/g, '-') },
    body: new Uint8Array(sent.body),
  });

// The handler's answer: its run and what it read.
const done = (reply: FastifyReply, run: number, files: number[], fields: string[]) =>
  reply.code(201).send({ run, files, fields });

async function readParts(request: FastifyRequest) {
  const files: number[] = [];
  const fields: string[] = [];
  for await (const part of request.parts()) {
    if (part.type === 'file') files.push((await part.toBuffer()).length);
    else fields.push(part.fieldname);
  }
  return { files, fields };
}

// The upload is read by the handler, each way @fastify/multipart offers, before its work.
const handlerReads = (app: FastifyInstance, ran: () => number) => {
  app.post('/file', async (request, reply) => {
    const data = await request.file();
    const size = data === undefined ? 0 : (await data.toBuffer()).length;
    return done(
      reply,
      ran(),
      [size],
      Object.keys(data?.fields ?? {}).filter((name) => name !== data?.fieldname),
    );
  });
  app.post('/parts', async (request, reply) => {
    const { files, fields } = await readParts(request);
    return done(reply, ran(), files, fields);
  });
  app.post('/saved', async (request, reply) => {
    const saved = await request.saveRequestFiles();
    return done(
      reply,
      ran(),
      saved.files.map((one) => one.file.bytesRead),
      Object.keys(saved.values).filter((name) => !saved.files.some((one) => one.fieldname === name)),
    );
  });
};

// In transactional mode too: the refusal's answer is held, rolled back and served once the key is free.
describe.each([false, true])(
  '@fastify/multipart, the handler reads the upload (transactional: %s)',
  (transactional) => {
    let server: Server;
    beforeAll(async () => {
      server = await start({ transactional }, handlerReads);
    });
    afterAll(() => server.app.close());

    it('a valid upload is run once, stored and replayed', async () => {
      for (const path of ['/file', '/parts', '/saved']) {
        const before = server.runs();
        const first = await send(`${server.url}${path}`, `ok${path}`, fixed);
        expect(first.status, path).toBe(201);
        const body = await first.json();
        expect(body, path).toMatchObject({ run: before + 1, files: [50] });
        const again = await send(`${server.url}${path}`, `ok${path}`, fixed);
        expect(again.status, path).toBe(201);
        expect(again.headers.get('idempotent-replayed'), path).toBe('true');
        expect(await again.json(), path).toEqual(body);
        expect(server.runs(), path).toBe(before + 1);
      }
    });

    // `request.file()` reads up to the first file alone: a limit over in a later part is never met,
    // and what is wrong with a field before it is passed over (@fastify/multipart keeps the error
    // for a next part no one asks for), so the handler runs.
    const cases = [...refusals, notMultipart].flatMap((refused) =>
      ['/file', '/parts', '/saved']
        .filter((path) => path !== '/file' || /fileSize|cut|boundary|JSON body/.test(refused.name))
        .map((path) => [`${path}: ${refused.name}`, path, refused] as const),
    );

    it.each(cases)('%s: refused, not stored, and the fixed retry runs', async (_name, path, refused) => {
      const key = `refused-${path}-${refused.name}`;
      const url = `${server.url}${path}`;
      const answer = await send(url, key, refused);
      expect(answer.status).toBe(refused.status);
      expect(answer.headers.get('idempotency-key')).toBeNull();
      const runs = server.runs();
      const retry = await send(url, key, fixed);
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotent-replayed')).toBeNull();
      expect(await retry.json()).toMatchObject({ run: runs + 1, files: [50] });
      expect(server.runs()).toBe(runs + 1);
      expect(server.events.filter((event) => event.type === 'response-not-stored').at(-1)).toMatchObject({
        reason: 'body-refused',
        status: refused.status,
      });
    });
  },
);

describe('@fastify/multipart with attachFieldsToBody', () => {
  let server: Server;
  beforeAll(async () => {
    server = await start({ attachFieldsToBody: true }, (app, ran) => {
      // A body schema, as the plugin's README has one: a request that is no multipart fails it.
      app.post('/body', { schema: { body: { type: 'object', required: ['receipt'] } } }, async (request, reply) => {
        // One entry per name in these uploads: a file (its bytes in `_buf`) or a field.
        const body = request.body as Record<string, { type: 'file' | 'field'; _buf?: Buffer | null }>;
        const files = Object.values(body)
          .filter((entry) => entry.type === 'file')
          .map((entry) => entry._buf?.length ?? 0);
        return done(
          reply,
          ran(),
          files,
          Object.keys(body).filter((name) => name !== 'receipt'),
        );
      });
    });
  });
  afterAll(() => server.app.close());

  it('a valid upload is run once, stored and replayed', async () => {
    const first = await send(`${server.url}/body`, 'ok', fixed);
    expect(first.status).toBe(201);
    const body = await first.json();
    expect(body).toEqual({ run: 1, files: [50], fields: ['note'] });
    const again = await send(`${server.url}/body`, 'ok', fixed);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.json()).toEqual(body);
    expect(server.runs()).toBe(1);
  });

  it.each([
    ...refusals.map((refused) => [refused.name, refused] as const),
    ['a JSON body', { ...notMultipart, status: 400 }] as const,
  ])('%s: refused before the key is claimed, and the fixed retry runs', async (name, refused) => {
    const key = `refused-${name}`;
    const answer = await send(`${server.url}/body`, key, refused);
    expect(answer.status).toBe(refused.status);
    expect(answer.headers.get('idempotency-key')).toBeNull();
    const runs = server.runs();
    const retry = await send(`${server.url}/body`, key, fixed);
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(server.runs()).toBe(runs + 1);
  });
});

describe('@fastify/multipart, where the handler works before it reads the upload', () => {
  let server: Server;
  let effects = 0;
  beforeAll(async () => {
    server = await start({}, (app, ran) => {
      // The effect comes first, the upload after: its refusal is thrown after the work.
      app.post('/effect-first', async (request, reply) => {
        effects++;
        const { files, fields } = await readParts(request);
        return done(reply, ran(), files, fields);
      });
      // The same, but the handler answers the refusal itself: its answer, stored like any other.
      app.post('/effect-first-answered', async (request, reply) => {
        effects++;
        try {
          const { files, fields } = await readParts(request);
          return done(reply, ran(), files, fields);
        } catch (error) {
          const status = (error as { statusCode?: number }).statusCode ?? 500;
          return reply.code(status).send({ refused: (error as { code?: string }).code, effects });
        }
      });
      // A text field over fieldSize is cut, not refused (busboy marks it `valueTruncated`): the
      // handler that refuses it says that nothing happened, so the key is released.
      app.post('/field-size', async (request, reply) => {
        const fields: string[] = [];
        for await (const part of request.parts()) {
          if (part.type === 'file') await part.toBuffer();
          else if (part.valueTruncated) {
            request.idempotency?.release();
            return reply.code(413).send({ refused: part.fieldname });
          } else fields.push(part.fieldname);
        }
        return done(reply, ran(), [], fields);
      });
    });
  });
  afterAll(() => server.app.close());

  const tooLarge = upload([{ name: 'note', value: 'hello' }, file(500)]);

  it("a refusal thrown after the handler's work releases the key all the same: the same upload runs the work again", async () => {
    // The cost of taking a refusal where the handler reads the upload for what it is: a handler
    // that works before reading repeats that work for each retry of the same refused upload. (Kept
    // instead, the fixed upload would be another request under the key, 422, and its new key would
    // run the work again all the same.) The guide says: read the upload first.
    effects = 0;
    const url = `${server.url}/effect-first`;
    expect((await send(url, 'effect-first', tooLarge)).status).toBe(413);
    expect((await send(url, 'effect-first', tooLarge)).status).toBe(413);
    expect(effects).toBe(2);
    const retry = await send(url, 'effect-first', fixed);
    expect(retry.status).toBe(201);
    expect(effects).toBe(3);
  });

  it('a handler that answers the refusal itself keeps its key: the same upload is replayed, a fixed one is another request', async () => {
    effects = 0;
    const url = `${server.url}/effect-first-answered`;
    const first = await send(url, 'answered', tooLarge);
    expect(first.status).toBe(413);
    expect(await first.json()).toEqual({ refused: 'FST_REQ_FILE_TOO_LARGE', effects: 1 });
    const again = await send(url, 'answered', tooLarge);
    expect(again.status).toBe(413);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await send(url, 'answered', fixed)).status).toBe(422);
    expect(effects).toBe(1);
  });

  it('a text field over fieldSize, refused by the handler after release(): the fixed retry runs', async () => {
    const url = `${server.url}/field-size`;
    const long = upload([{ name: 'note', value: 'x'.repeat(40) }]);
    const answer = await send(url, 'field-size', long);
    expect(answer.status).toBe(413);
    const runs = server.runs();
    const retry = await send(url, 'field-size', upload([{ name: 'note', value: 'short' }]));
    expect(retry.status).toBe(201);
    expect(await retry.json()).toEqual({ run: runs + 1, files: [], fields: ['note'] });
  });
});

describe("@fastify/multipart's errors, when they are not about the request's own body", () => {
  let server: Server;
  beforeAll(async () => {
    server = await start({}, (app, ran) => {
      // The work, then an error shaped like a refusal of the upload: of another request (a JSON one
      // has no upload), or of a multipart body other than this request's.
      app.post('/after-work', async (request) => {
        ran();
        const { kind } = request.query as { kind: string };
        if (kind === 'file-too-large') throw new app.multipartErrors.RequestFileTooLargeError();
        if (kind === 'files-limit') throw new app.multipartErrors.FilesLimitError();
        if (kind === 'not-multipart') throw new app.multipartErrors.InvalidMultipartContentTypeError();
        throw new Error('Unexpected end of multipart data');
      });
    });
  });
  afterAll(() => server.app.close());

  const json: Sent = { headers: { 'content-type': 'application/json' }, body: Buffer.from('{"amount":1}') };

  it.each([
    ['a file over fileSize, on a JSON request', 'file-too-large', json, 413],
    ['files over the limit, on a JSON request', 'files-limit', json, 413],
    ['busboy cut short, on a JSON request', 'busboy', json, 500],
    ['busboy cut short, on a whole multipart request', 'busboy', fixed, 500],
    ['no multipart, on a multipart request', 'not-multipart', fixed, 406],
  ] as const)('%s: the answer is kept and replayed', async (name, kind, sent, status) => {
    const url = `${server.url}/after-work?kind=${kind}`;
    const runs = server.runs();
    const first = await send(url, `kept-${name}`, sent);
    expect(first.status).toBe(status);
    expect(first.headers.get('idempotency-key')).not.toBeNull();
    const again = await send(url, `kept-${name}`, sent);
    expect(again.status).toBe(status);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(server.runs()).toBe(runs + 1);
  });
});
