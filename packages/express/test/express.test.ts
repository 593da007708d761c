import { request as httpRequest } from 'node:http';
import { gzipSync } from 'node:zlib';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { type ExpressIdempotencyOptions, idempotency, idempotencyErrors } from '@idem/express';
import { multipartForm, transactionalMemoryStore } from '@idem/testkit';
import express from 'express';
import multer from 'multer';
import { describe, expect, it } from 'vitest';
import { replaysCompressedJson } from '../../core/test/support/compressed-json.js';
import { captureWarnings } from '../../core/test/support/warnings.js';
import { type Answer, send, serve, withCompletion } from './support.js';

// Express 4 (the `express4` alias), for what depends on how its router works: the same API as far
// as these tests use it, without types of its own.
const express4 = (await import('express4' as string)).default as typeof express;

// An upload of one file of `size` bytes (and a text field), as the table sends it.
function upload(size: number): { headers: Record<string, string>; body: Buffer } {
  const { body, contentType } = multipartForm('idem-boundary', Buffer.alloc(size, 7));
  return { headers: { 'content-type': contentType }, body };
}
// The same upload without its closing delimiter, as a client that stopped writing sends it.
function cutShort(sent: { headers: Record<string, string>; body: Buffer }) {
  return { headers: sent.headers, body: sent.body.subarray(0, sent.body.lastIndexOf('--idem-boundary--')) };
}
// The same upload with a part header line that has no colon, as a broken client may write it.
function malformedHeader(sent: { headers: Record<string, string>; body: Buffer }) {
  return {
    headers: sent.headers,
    body: Buffer.from(sent.body.toString('latin1').replace('Content-Disposition:', 'Content-Disposition'), 'latin1'),
  };
}
// Sends `chunks` one by one; without a content-length the body goes out chunked.
const post = (url: string, key: string, chunks: string[], contentLength = true) =>
  send(
    url,
    'POST',
    [
      ['idempotency-key', key],
      ['content-type', 'application/json'],
    ],
    chunks,
    contentLength,
  );

// Resolves with the first event of `type` reported to `onEvent`.
function eventOf(type: IdempotencyEvent['type']) {
  let resolve!: (event: IdempotencyEvent) => void;
  const seen = new Promise<IdempotencyEvent>((r) => {
    resolve = r;
  });
  return { seen, onEvent: (event: IdempotencyEvent) => void (event.type === type && resolve(event)) };
}

const options = (extra: Partial<ExpressIdempotencyOptions> = {}): ExpressIdempotencyOptions => ({
  store: memoryStore(),
  scope: () => 'tenant-1',
  ...extra,
});

/**
 * Runs `check` on Express 5 and 4, each plain and transactional: each case with its label (and a
 * slug of it for keys), its Express, the middleware options and the events they report.
 */
async function eachSetup(
  check: (setup: {
    label: string;
    slug: string;
    createApp: typeof express;
    settings: ExpressIdempotencyOptions;
    events: IdempotencyEvent[];
  }) => Promise<void>,
) {
  for (const [version, createApp] of [
    ['express 5', express],
    ['express 4', express4],
  ] as const) {
    for (const transactional of [false, true]) {
      const label = `${version}${transactional ? ', transactional' : ''}`;
      const events: IdempotencyEvent[] = [];
      const settings = options({
        ...(transactional ? { store: transactionalMemoryStore(), transactional } : {}),
        onEvent: (event) => events.push(event),
      });
      await check({ label, slug: label.replace(/\W+/g, '-'), createApp, settings, events });
    }
  }
}

/** Mounts `handler` behind idempotency on the route itself and, with use(), on a router at /api. */
function mountOnRouteAndRouter(
  app: express.Express,
  createApp: typeof express,
  settings: ExpressIdempotencyOptions,
  handler: express.RequestHandler,
) {
  app.post('/direct/:id', idempotency(settings), handler);
  const api = createApp.Router();
  api.use(idempotency(settings));
  api.post('/charges/:id', handler);
  app.use('/api', api);
  app.use(idempotencyErrors());
}

describe('@idem/express specifics', () => {
  it('reads a chunked body before express.json, which still parses it', async () => {
    const app = express();
    let runs = 0;
    app.post('/charges', idempotency(options()), express.json({ limit: '1mb' }), (req, res) => {
      runs++;
      res.status(201).json({ got: req.body });
    });
    await serve(app, async (url) => {
      const chunks = ['{"amount":', '100,', '"note":"', 'x'.repeat(200_000), '"}'];
      const first = await post(`${url}/charges`, 'chunked-1', chunks, false);
      expect(first.status).toBe(201);
      expect(JSON.parse(first.body).got.amount).toBe(100);
      expect(JSON.parse(first.body).got.note.length).toBe(200_000);
      const again = await post(`${url}/charges`, 'chunked-1', chunks, true);
      expect(again.headers['idempotent-replayed']).toBe('true');
      const other = await post(`${url}/charges`, 'chunked-1', ['{"amount":101}']);
      expect(other.status).toBe(422);
      expect(runs).toBe(1);
    });
  });

  it('a compressed body is fingerprinted by what it decodes to: gzipped again, deflated, br or plain, the same JSON replays', async () => {
    const app = express();
    const seen: unknown[] = [];
    // Mounted before the parser, which inflates the body (express.json's `inflate` is on by default).
    app.post('/charges', idempotency(options()), express.json(), (req, res) => {
      seen.push(req.body);
      res.status(201).json({ id: 'ch_1', amount: req.body.amount });
    });
    await serve(app, (url) => replaysCompressedJson(`${url}/charges`, seen));
  });

  it('mounted after express.json: fingerprints the parsed JSON, so replays and mismatches still work', async () => {
    const app = express();
    let runs = 0;
    app.use(express.json());
    app.use(idempotency(options()));
    app.post('/charges', (req, res) => {
      runs++;
      res.status(201).json({ amount: req.body.amount, run: runs });
    });
    await serve(app, async (url) => {
      const first = await post(`${url}/charges`, 'after-1', ['{"amount":5}']);
      const same = await post(`${url}/charges`, 'after-1', ['{ "amount": 5 }']);
      const other = await post(`${url}/charges`, 'after-1', ['{"amount":6}']);
      expect(first.status).toBe(201);
      expect(same.headers['idempotent-replayed']).toBe('true');
      expect(same.body).toBe(first.body);
      expect(other.status).toBe(422);
      expect(runs).toBe(1);
      // Nesting deeper than JSON.stringify can recurse: express.json accepts it, and so does the
      // fingerprint (a 500 before), which then tells it from another deep body.
      const deep = (inner: string) => `{"amount":7,"deep":${'['.repeat(30_000)}${inner}${']'.repeat(30_000)}}`;
      const deepFirst = await post(`${url}/charges`, 'after-deep', [deep('1')]);
      expect(deepFirst.status).toBe(201);
      expect((await post(`${url}/charges`, 'after-deep', [deep('1')])).headers['idempotent-replayed']).toBe('true');
      expect((await post(`${url}/charges`, 'after-deep', [deep('2')])).status).toBe(422);
      expect(runs).toBe(2);
    });
  });

  it('after a JSON parser that keeps big integers exact (bigints): fingerprints them as their digits, no 500', async () => {
    const app = express();
    let runs = 0;
    const reviver = (_key: string, value: unknown, context?: { source?: string }) =>
      typeof value === 'number' && !Number.isSafeInteger(value) && context?.source ? BigInt(context.source) : value;
    app.use(express.json({ reviver }));
    app.use(idempotency(options()));
    app.post('/charges', (req, res) => {
      runs++;
      res.status(201).json({ amount: String(req.body.amount), run: runs });
    });
    await serve(app, async (url) => {
      const first = await post(`${url}/charges`, 'big-1', ['{"amount":123456789012345678901234}']);
      expect(first.status, first.body).toBe(201);
      expect(JSON.parse(first.body)).toEqual({ amount: '123456789012345678901234', run: 1 });
      const same = await post(`${url}/charges`, 'big-1', ['{ "amount": 123456789012345678901234 }']);
      expect(same.headers['idempotent-replayed']).toBe('true');
      expect((await post(`${url}/charges`, 'big-1', ['{"amount":1}'])).status).toBe(422);
      expect(runs).toBe(1);
    });
  });

  it('mounted on a route, the operation is the route template: one key spans /charges/:id only with the same path', async () => {
    const app = express();
    const events: IdempotencyEvent[] = [];
    app.post('/charges/:id/capture', idempotency(options({ onEvent: (event) => events.push(event) })), (req, res) => {
      res.status(200).json({ id: req.params.id });
    });
    await serve(app, async (url) => {
      expect((await post(`${url}/charges/a/capture`, 'route-1', ['{}'])).status).toBe(200);
      // Same key and template, other concrete path: the same record, another request.
      expect((await post(`${url}/charges/b/capture`, 'route-1', ['{}'])).status).toBe(422);
      expect(events.find((event) => event.type === 'claim')?.operation).toBe('POST /charges/:id/capture');
    });
  });

  it('an app-wide instance and a route instance on one request: the first governs, the second steps aside and warns once', async () => {
    const app = express();
    const store = memoryStore();
    const outer: IdempotencyEvent[] = [];
    const inner: IdempotencyEvent[] = [];
    let runs = 0;
    app.use(idempotency(options({ store, onEvent: (event) => outer.push(event) })));
    app.post(
      '/charges',
      idempotency(options({ store, retention: '48h', onEvent: (event) => inner.push(event) })),
      (_req, res) => {
        runs++;
        res.status(201).json({ id: `ch_${runs}` });
      },
    );
    const warnings = captureWarnings();
    try {
      await serve(app, async (url) => {
        // Before, the route instance claimed the key the app-wide one held: 409 for every first request.
        const first = await post(`${url}/charges`, 'stacked-1', ['{}']);
        expect(first.status).toBe(201);
        const again = await post(`${url}/charges`, 'stacked-1', ['{}']);
        expect(again.status).toBe(201);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect((await post(`${url}/charges`, 'stacked-2', ['{}'])).status).toBe(201);
      });
    } finally {
      warnings.stop();
    }
    expect(runs).toBe(2);
    expect(outer.filter((event) => event.type === 'claim')).toHaveLength(2);
    expect(inner).toEqual([]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(warnings.withCode('IDEM_STACKED')).toHaveLength(1);
  });

  it('refuses bad options once, at construction', () => {
    expect(() => idempotency(options({ replayHeaders: ['Set-Cookie'] }))).toThrow(TypeError);
    expect(() => idempotency(options({ replayHeaders: ['x-request-id'] }))).toThrow(TypeError);
    expect(() => idempotency(options({ methods: ['GET'] }))).toThrow(TypeError);
    expect(() => idempotency(options({ maxBodyBytes: 0 }))).toThrow(TypeError);
    expect(() => idempotency(options({ scope: 'user' as never }))).toThrow(TypeError);
    // Sent as Retry-After, which takes whole seconds only.
    expect(() => idempotency(options({ conflictRetryAfter: '1s' as never }))).toThrow(/conflictRetryAfter/);
    expect(() => idempotency(options({ unavailableRetryAfter: 1.5 }))).toThrow(/unavailableRetryAfter/);
    expect(() => idempotency({} as ExpressIdempotencyOptions)).toThrow(TypeError);
  });

  it('replays user-listed headers on top of the allowlist', async () => {
    const app = express();
    app.post('/charges', idempotency(options({ replayHeaders: ['X-Charge-Version'] })), (_req, res) => {
      res.status(201).set({ 'x-charge-version': '7', 'x-other': 'no' }).json({ ok: true });
    });
    await serve(app, async (url) => {
      await post(`${url}/charges`, 'headers-1', ['{}']);
      const again = await post(`${url}/charges`, 'headers-1', ['{}']);
      expect(again.headers['x-charge-version']).toBe('7');
      expect(again.headers['x-other']).toBeUndefined();
    });
  });

  it('keeps headers earlier middleware set (CORS) on replays and problems', async () => {
    const app = express();
    app.use((_req, res, next) => {
      res.set('access-control-allow-origin', 'https://app.example');
      next();
    });
    app.post('/charges', idempotency(options()), (_req, res) => {
      res.status(201).json({ ok: true });
    });
    await serve(app, async (url) => {
      await post(`${url}/charges`, 'cors-1', ['{}']);
      const replay = await post(`${url}/charges`, 'cors-1', ['{}']);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['access-control-allow-origin']).toBe('https://app.example');
      const mismatch = await post(`${url}/charges`, 'cors-1', ['{"other":1}']);
      expect(mismatch.status).toBe(422);
      expect(mismatch.headers['access-control-allow-origin']).toBe('https://app.example');
    });
  });

  it('with a Content-Length, the last byte waits for the outcome to be stored, so an instant retry replays', async () => {
    const inner = memoryStore();
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => {
      openGate = resolve;
    });
    let completing!: () => void;
    const completeCalled = new Promise<void>((resolve) => {
      completing = resolve;
    });
    // A store whose completion waits: the window in which a client could already hold the whole body.
    const store = withCompletion(inner, async (input) => {
      completing();
      await gate;
      return inner.complete(input);
    });
    const body = Buffer.alloc(50_000, 7);
    const app = express();
    app.post('/files', idempotency(options({ store })), (_req, res) => {
      res.status(200).set({ 'content-type': 'application/octet-stream', 'content-length': String(body.length) });
      // Every byte through write(), end() without data: the client needs nothing from end().
      res.write(body.subarray(0, 20_000));
      res.write(body.subarray(20_000));
      res.end();
    });
    await serve(app, async (url) => {
      // Counts the body bytes the client has, and says when it has all but the last one: what it
      // holds while the outcome is being stored, if the capture holds that byte back.
      let received = 0;
      let allButLast!: (count: number) => void;
      const allButLastIn = new Promise<number>((resolve) => {
        allButLast = resolve;
      });
      const first = new Promise<Answer>((resolve, reject) => {
        const req = httpRequest(
          `${url}/files`,
          {
            method: 'POST',
            agent: false,
            headers: { 'idempotency-key': 'length-1', 'content-type': 'application/json', 'content-length': '2' },
          },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (chunk: Buffer) => {
              chunks.push(chunk);
              received += chunk.length;
              if (received >= body.length - 1) allButLast(received);
            });
            res.on('end', () =>
              resolve({
                status: res.statusCode ?? 0,
                headers: res.headers,
                body: Buffer.concat(chunks).toString('latin1'),
              }),
            );
          },
        );
        req.on('error', reject);
        req.end('{}');
      });
      await completeCalled;
      const early = await Promise.race([first.then(() => 'answered'), allButLastIn.then(() => 'held')]);
      expect(early).toBe('held');
      // Everything but the last byte, which waits for the store: the client cannot have the whole response.
      expect(await allButLastIn).toBe(body.length - 1);
      openGate();
      const answered = await first;
      expect(answered.status).toBe(200);
      expect(Buffer.from(answered.body, 'latin1').length).toBe(body.length);
      const again = await post(`${url}/files`, 'length-1', ['{}']);
      expect(again.status).toBe(200);
      expect(again.headers['idempotent-replayed']).toBe('true');
    });
  });
  it('after express.json({ strict: false }): a JSON string body is the string, "123" is not 123', async () => {
    const app = express();
    let runs = 0;
    app.use(express.json({ strict: false }));
    app.use(idempotency(options()));
    app.post('/charges', (req, res) => {
      res.status(201).json({ run: ++runs, type: typeof req.body });
    });
    await serve(app, async (url) => {
      expect((await post(`${url}/charges`, 'n-1', ['123'])).status).toBe(201);
      expect((await post(`${url}/charges`, 'n-1', ['"123"'])).status).toBe(422);
      expect((await post(`${url}/charges`, 's-1', ['{"amount":1}'])).status).toBe(201);
      expect((await post(`${url}/charges`, 's-1', [JSON.stringify('{"amount":1}')])).status).toBe(422);
      expect((await post(`${url}/charges`, 's-2', ['"123"'])).status).toBe(201);
      expect((await post(`${url}/charges`, 's-2', [' "123"'])).headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(3);
    });
  });

  it("a body the parser refuses (too large for express.json's limit) is not stored when idempotencyErrors() is mounted", async () => {
    for (const transactional of [false, true]) {
      const events: IdempotencyEvent[] = [];
      const app = express();
      let runs = 0;
      const store = transactional ? transactionalMemoryStore() : memoryStore();
      app.use(idempotency(options({ store, transactional, onEvent: (event) => events.push(event) })));
      app.use(express.json({ limit: 20 }));
      app.post('/charges', (_req, res) => {
        res.status(201).json({ run: ++runs });
      });
      app.use(idempotencyErrors());
      await serve(app, async (url) => {
        const refused = await post(`${url}/charges`, 'big-1', [JSON.stringify({ note: 'x'.repeat(40) })]);
        expect(refused.status).toBe(413);
        expect(refused.headers['idempotency-key']).toBeUndefined();
        expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([
          { reason: 'body-refused', status: 413 },
        ]);
        expect((await post(`${url}/charges`, 'big-1', ['{"note":"x"}'])).status).toBe(201);
        expect(runs).toBe(1);
      });
    }
  });

  it('a route the middleware is not mounted on takes a key as any other header: nothing claimed, stored or echoed (29)', async () => {
    const events: IdempotencyEvent[] = [];
    const app = express();
    let runs = 0;
    app.post('/charges', idempotency(options({ onEvent: (event) => events.push(event) })), (_req, res) => {
      res.status(201).json({ path: '/charges', run: ++runs });
    });
    app.post('/notes', (_req, res) => {
      res.status(201).json({ path: '/notes', run: ++runs });
    });
    await serve(app, async (url) => {
      for (const run of [1, 2]) {
        const answer = await post(`${url}/notes`, 'k-29', ['{}']);
        expect(answer.headers['idempotency-key']).toBeUndefined();
        expect(answer.headers['idempotent-replayed']).toBeUndefined();
        expect(JSON.parse(answer.body)).toEqual({ path: '/notes', run });
      }
      expect(events).toEqual([]);
      expect((await post(`${url}/charges`, 'k-29', ['{}'])).headers['idempotency-key']).toBe('k-29');
      expect((await post(`${url}/charges`, 'k-29', ['{}'])).headers['idempotent-replayed']).toBe('true');
    });
  });

  it("every refusal body-parser raises for the request's own body is told from a handler's error: not stored, the fixed retry runs", async () => {
    const events: IdempotencyEvent[] = [];
    const app = express();
    let runs = 0;
    app.use(idempotency(options({ onEvent: (event) => events.push(event) })));
    const verify = (_req: unknown, _res: unknown, body: Buffer) => {
      if (body.includes('forged')) throw new Error('signature does not match');
    };
    app.post('/json', express.json({ limit: 60, verify }), (_req, res) => {
      res.status(201).json({ run: ++runs });
    });
    app.post('/form', express.urlencoded({ parameterLimit: 2 }), (_req, res) => {
      res.status(201).json({ run: ++runs });
    });
    // multer's refusals carry no status Express reads: a MulterError (LIMIT_FILE_SIZE here) is a 500.
    app.post('/upload', multer({ limits: { fileSize: 100 } }).single('receipt'), (_req, res) => {
      res.status(201).json({ run: ++runs });
    });
    app.use(idempotencyErrors());
    const json = { 'content-type': 'application/json' };
    const form = { 'content-type': 'application/x-www-form-urlencoded' };
    const cases: Array<{ name: string; path: string; headers: Record<string, string>; body: Buffer; status: number }> =
      [
        { name: 'parse', path: '/json', headers: json, body: Buffer.from('{"amount":'), status: 400 },
        {
          name: 'parse, gzip',
          path: '/json',
          headers: { ...json, 'content-encoding': 'gzip' },
          body: gzipSync('{"amount":'),
          status: 400,
        },
        // Bytes that do not inflate: body-parser passes the decoder's error on as 400 (code kept, no type).
        {
          name: 'gzip that is no gzip',
          path: '/json',
          headers: { ...json, 'content-encoding': 'gzip' },
          body: Buffer.from('{"amount":1} not gzip'),
          status: 400,
        },
        {
          name: 'gzip cut short',
          path: '/json',
          headers: { ...json, 'content-encoding': 'gzip' },
          body: gzipSync('{"amount":1}').subarray(0, 12),
          status: 400,
        },
        {
          name: 'br that is no br',
          path: '/json',
          headers: { ...json, 'content-encoding': 'br' },
          body: Buffer.from('{"amount":1} not br'),
          status: 400,
        },
        { name: 'verify', path: '/json', headers: json, body: Buffer.from('{"note":"forged"}'), status: 403 },
        {
          name: 'too large',
          path: '/json',
          headers: json,
          body: Buffer.from(`{"note":"${'x'.repeat(80)}"}`),
          status: 413,
        },
        {
          name: 'charset',
          path: '/json',
          headers: { 'content-type': 'application/json; charset=latin1' },
          body: Buffer.from('{}'),
          status: 415,
        },
        {
          name: 'coding',
          path: '/json',
          headers: { ...json, 'content-encoding': 'compress' },
          body: Buffer.from('{}'),
          status: 415,
        },
        { name: 'parameters', path: '/form', headers: form, body: Buffer.from('a=1&b=2&c=3'), status: 413 },
        { name: 'multer: a file over its fileSize', path: '/upload', ...upload(500), status: 500 },
        // busboy's own error, passed on by multer with no status: a Content-Type without a boundary.
        {
          name: 'multer: no boundary',
          path: '/upload',
          headers: { 'content-type': 'multipart/form-data' },
          body: upload(50).body,
          status: 500,
        },
        // busboy's "Unexpected end of form": the body stops before its closing delimiter.
        { name: 'multer: cut short', path: '/upload', ...cutShort(upload(50)), status: 500 },
        // busboy's "Malformed part header": a part header line with no colon.
        { name: 'multer: malformed part header', path: '/upload', ...malformedHeader(upload(50)), status: 500 },
      ];
    await serve(app, async (url) => {
      for (const [i, refused] of cases.entries()) {
        const key = `refused-${i}`;
        const sent = (headers: Record<string, string>, body: Buffer) =>
          fetch(`${url}${refused.path}`, {
            method: 'POST',
            headers: { 'idempotency-key': key, ...headers },
            body: new Uint8Array(body),
          });
        const answer = await sent(refused.headers, refused.body);
        expect(answer.status, refused.name).toBe(refused.status);
        expect(answer.headers.get('idempotency-key'), refused.name).toBeNull();
        const fixed =
          refused.path === '/form'
            ? { headers: form, body: Buffer.from('a=1') }
            : refused.path === '/upload'
              ? upload(50)
              : { headers: json, body: Buffer.from('{"amount":1}') };
        const retry = await sent(fixed.headers, fixed.body);
        expect(retry.status, refused.name).toBe(201);
        expect(await retry.json(), refused.name).toEqual({ run: i + 1 });
      }
      expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject(
        cases.map((refused) => ({ reason: 'body-refused', status: refused.status })),
      );
    });
  });

  it('mounted with app.use, the operation is the path as the router matches it: /charges, /charges/ and /CHARGES are one', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency(options()));
    app.use(express.json());
    app.post('/charges', (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_${runs}` });
    });
    await serve(app, async (url) => {
      expect((await post(`${url}/charges`, 'spelling-1', ['{"amount":1}'])).status).toBe(201);
      // Express routes all of them to the same handler: one key, one operation, one run. The concrete
      // path still tells the requests apart (it is fingerprinted as sent), so a respelled retry is
      // answered 422 rather than replayed.
      for (const path of ['/charges/', '/CHARGES', '/Charges/']) {
        const again = await post(`${url}${path}`, 'spelling-1', ['{"amount":1}']);
        expect(again.status, path).toBe(422);
      }
      expect(runs).toBe(1);
    });
  });

  it('mounted on a route of a router: the mount path is folded as the app matched it, so /API and /api are one operation', async () => {
    const app = express();
    const api = express.Router();
    let runs = 0;
    const events: IdempotencyEvent[] = [];
    api.post('/charges', idempotency(options({ onEvent: (event) => events.push(event) })), (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_${runs}` });
    });
    app.use('/api', api);
    await serve(app, async (url) => {
      expect((await post(`${url}/api/charges`, 'mount-1', ['{"amount":1}'])).status).toBe(201);
      // The same router and handler: never a second run. The concrete path is fingerprinted as sent.
      expect((await post(`${url}/API/charges`, 'mount-1', ['{"amount":1}'])).status).toBe(422);
      expect(runs).toBe(1);
      const operations = events.filter((event) => event.type === 'claim').map((event) => event.operation);
      expect(operations).toEqual(['POST /api/charges']);
    });

    const sensitive = express();
    sensitive.set('case sensitive routing', true);
    const router = express.Router();
    router.post('/charges', idempotency(options()), (_req, res) => {
      res.status(201).json({});
    });
    sensitive.use('/API', router);
    const seen: IdempotencyEvent[] = [];
    const other = express.Router();
    other.post('/charges', idempotency(options({ onEvent: (event) => seen.push(event) })), (_req, res) => {
      res.status(201).json({});
    });
    sensitive.use('/Api', other);
    await serve(sensitive, async (url) => {
      expect((await post(`${url}/Api/charges`, 'mount-2', ['{}'])).status).toBe(201);
      expect(seen.find((event) => event.type === 'claim')?.operation).toBe('POST /Api/charges');
    });
  });

  // docs/guides/express.md: a mount path with parameters is in the operation as the request spelled
  // it (Express keeps no template of a mount path), unlike on Fastify and Koa.
  it('mounted on a route of a router whose mount path has parameters: each concrete mount path is its own operation', async () => {
    const app = express();
    const tenant = express.Router({ mergeParams: true });
    let runs = 0;
    const events: IdempotencyEvent[] = [];
    tenant.post('/charges', idempotency(options({ onEvent: (event) => events.push(event) })), (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_${runs}` });
    });
    app.use('/tenants/:tid', tenant);
    await serve(app, async (url) => {
      expect((await post(`${url}/tenants/1/charges`, 'tenant-1', ['{"amount":1}'])).status).toBe(201);
      expect((await post(`${url}/tenants/2/charges`, 'tenant-1', ['{"amount":1}'])).status).toBe(201);
      expect(runs).toBe(2);
      const operations = events.filter((event) => event.type === 'claim').map((event) => event.operation);
      expect(operations).toEqual(['POST /tenants/1/charges', 'POST /tenants/2/charges']);
    });
  });

  it('follows the app routing settings: with case sensitive and strict routing, other spellings are other operations', async () => {
    const app = express();
    app.set('case sensitive routing', true);
    app.set('strict routing', true);
    const ran: string[] = [];
    const events: IdempotencyEvent[] = [];
    app.use(idempotency(options({ onEvent: (event) => events.push(event) })));
    for (const path of ['/charges', '/Charges', '/charges/']) {
      app.post(path, (_req, res) => {
        ran.push(path);
        res.status(201).json({ path });
      });
    }
    await serve(app, async (url) => {
      for (const path of ['/charges', '/Charges', '/charges/']) {
        expect((await post(`${url}${path}`, 'settings-1', ['{}'])).status, path).toBe(201);
      }
      expect(ran).toEqual(['/charges', '/Charges', '/charges/']);
      const operations = events.filter((event) => event.type === 'claim').map((event) => event.operation);
      expect(operations).toEqual(['POST /charges', 'POST /Charges', 'POST /charges/']);
    });
  });

  it('mounted with app.use: a 404 no route answered is not stored, so the route deployed later runs the key; a route 404 is stored', async () => {
    const app = express();
    const api = express.Router();
    let runs = 0;
    app.use(idempotency(options()));
    app.use(express.json());
    app.use('/api', api);
    api.post('/charges/:id/refunds', (_req, res) => {
      runs++;
      res.status(404).json({ error: 'no_such_charge' });
    });
    // The app's own not-found page, after every router.
    app.use((_req, res) => {
      res.status(404).json({ error: 'not_found' });
    });
    await serve(app, async (url) => {
      for (const path of ['/api/refunds', '/nowhere']) {
        const first = await post(`${url}${path}`, `deploy-${path}`, ['{}']);
        expect(first.status, path).toBe(404);
        expect(first.headers['idempotency-key'], path).toBeUndefined();
      }
      // The route is deployed (added to the running router): the same key runs it.
      api.post('/refunds', (_req, res) => {
        runs++;
        res.status(201).json({ id: 're_1' });
      });
      const deployed = await post(`${url}/api/refunds`, 'deploy-/api/refunds', ['{}']);
      expect(deployed.status).toBe(201);
      expect(deployed.headers['idempotent-replayed']).toBeUndefined();
      // A route's handler that answers 404 answered: stored and replayed.
      const missing = await post(`${url}/api/charges/ch_9/refunds`, 'missing-1', ['{}']);
      expect(missing.status).toBe(404);
      expect(missing.headers['idempotency-key']).toBe('missing-1');
      const again = await post(`${url}/api/charges/ch_9/refunds`, 'missing-1', ['{}']);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body).toBe(missing.body);
      expect(runs).toBe(2);
    });
  });

  it('transactional, mounted with app.use: a not-found page written in pieces goes out whole, and its key is released', async () => {
    const released = eventOf('release');
    const app = express();
    app.use(
      idempotency(options({ store: transactionalMemoryStore(), transactional: true, onEvent: released.onEvent })),
    );
    app.use((_req, res) => {
      res.status(404).type('text/plain');
      res.write('no such ');
      res.end('page');
    });
    await serve(app, async (url) => {
      const first = await post(`${url}/refunds`, 'tx-nowhere-1', ['{}']);
      expect(first.status).toBe(404);
      expect(first.body).toBe('no such page');
      expect(first.headers['idempotency-key']).toBeUndefined();
      await released.seen;
      const again = await post(`${url}/refunds`, 'tx-nowhere-1', ['{}']);
      expect(again.status).toBe(404);
      expect(again.body).toBe('no such page');
      expect(again.headers['idempotent-replayed']).toBeUndefined();
    });
  });

  it("a route that passes the request on with next() to Express's final 404 is no answer: not stored, the key released", async () => {
    await eachSetup(async ({ label, slug, createApp, settings, events }) => {
      const app = createApp();
      let runs = 0;
      // A route that answers only for charges it knows, and passes the rest on.
      const charge: express.RequestHandler = (req, res, next) => {
        runs++;
        if (req.params.id === 'ch_1') res.status(201).json({ id: 'ch_1', run: runs });
        else if (req.params.id === 'ch_gone') next(Object.assign(new Error('no such charge'), { status: 404 }));
        else next();
      };
      // On the route itself, and with use() on a router: both claim before the route passes.
      mountOnRouteAndRouter(app, createApp, settings, charge);
      await serve(app, async (url) => {
        for (const path of ['/direct/ch_9', '/api/charges/ch_9']) {
          const before = runs;
          const first = await post(`${url}${path}`, `pass-${path}`, ['{}']);
          expect(first.status, `${label} ${path}`).toBe(404);
          expect(first.body, `${label} ${path}`).toContain('Cannot POST');
          expect(first.headers['idempotency-key'], `${label} ${path}`).toBeUndefined();
          // Sent the moment the 404 arrived: the key is free, so the route runs again.
          const again = await post(`${url}${path}`, `pass-${path}`, ['{}']);
          expect(again.status, `${label} ${path}`).toBe(404);
          expect(again.headers['idempotent-replayed'], `${label} ${path}`).toBeUndefined();
          expect(runs - before, `${label} ${path}`).toBe(2);
        }
        const notStored = events.filter((event) => event.type === 'response-not-stored');
        expect(
          notStored.map((event) => ({ reason: event.reason, status: event.status })),
          label,
        ).toEqual(Array(4).fill({ reason: 'no-route', status: 404 }));
        expect(
          events.filter((event) => event.type === 'complete'),
          label,
        ).toEqual([]);
        // A route's answer is stored as ever; so is a 404 a route throws, which idempotencyErrors() tells apart.
        expect((await post(`${url}/api/charges/ch_1`, `answer-${slug}`, ['{}'])).status, label).toBe(201);
        const replayed = await post(`${url}/api/charges/ch_1`, `answer-${slug}`, ['{}']);
        expect(replayed.headers['idempotent-replayed'], label).toBe('true');
        const thrown = await post(`${url}/api/charges/ch_gone`, `thrown-${slug}`, ['{}']);
        expect(thrown.status, label).toBe(404);
        expect(thrown.headers['idempotency-key'], label).toBe(`thrown-${slug}`);
        const again = await post(`${url}/api/charges/ch_gone`, `thrown-${slug}`, ['{}']);
        expect(again.headers['idempotent-replayed'], label).toBe('true');
      });
    });
  });

  it('without idempotencyErrors(), a 404 error a route throws or passes to next(error) is no answer either: released, the retry runs', async () => {
    await eachSetup(async ({ label, createApp, settings, events }) => {
      const app = createApp();
      let runs = 0;
      const notFound = () => Object.assign(new Error('no such charge'), { status: 404 });
      app.post('/passed/:id', idempotency(settings), (_req, _res, next) => {
        runs++;
        next(notFound());
      });
      app.post('/thrown/:id', idempotency(settings), () => {
        runs++;
        throw notFound();
      });
      // No idempotencyErrors(): Express's final handler answers the error with its own 404.
      await serve(app, async (url) => {
        for (const path of ['/passed/ch_9', '/thrown/ch_9']) {
          const before = runs;
          const first = await post(`${url}${path}`, `error-${path}`, ['{}']);
          expect(first.status, `${label} ${path}`).toBe(404);
          expect(first.headers['idempotency-key'], `${label} ${path}`).toBeUndefined();
          const again = await post(`${url}${path}`, `error-${path}`, ['{}']);
          expect(again.status, `${label} ${path}`).toBe(404);
          expect(again.headers['idempotent-replayed'], `${label} ${path}`).toBeUndefined();
          expect(runs - before, `${label} ${path}`).toBe(2);
        }
      });
      expect(
        events.filter((event) => event.type === 'complete'),
        label,
      ).toEqual([]);
      expect(
        events.filter((event) => event.type === 'response-not-stored').map((event) => event.reason),
        label,
      ).toEqual(Array(4).fill('no-route'));
    });
  });

  it('a not-found middleware that answers after a route passed the request on with next() is an answer: stored and replayed', async () => {
    await eachSetup(async ({ label, slug, createApp, settings, events }) => {
      const app = createApp();
      let runs = 0;
      let notFoundRuns = 0;
      const charge: express.RequestHandler = (_req, _res, next) => {
        runs++;
        next();
      };
      mountOnRouteAndRouter(app, createApp, settings, charge);
      // The app's own not-found page after every route: Express leaves no trace that the route passed.
      app.use((_req, res) => {
        notFoundRuns++;
        res.status(404).json({ error: 'not_found', page: notFoundRuns });
      });
      await serve(app, async (url) => {
        for (const path of ['/direct/ch_9', '/api/charges/ch_9']) {
          const first = await post(`${url}${path}`, `page-${slug}-${path}`, ['{}']);
          expect(first.status, `${label} ${path}`).toBe(404);
          expect(first.headers['idempotency-key'], `${label} ${path}`).toBe(`page-${slug}-${path}`);
          const again = await post(`${url}${path}`, `page-${slug}-${path}`, ['{}']);
          expect(again.status, `${label} ${path}`).toBe(404);
          expect(again.headers['idempotent-replayed'], `${label} ${path}`).toBe('true');
          expect(again.body, `${label} ${path}`).toBe(first.body);
        }
      });
      expect(runs, label).toBe(2);
      expect(notFoundRuns, label).toBe(2);
      expect(
        events.filter((event) => event.type === 'complete'),
        label,
      ).toHaveLength(2);
      expect(
        events.filter((event) => event.type === 'response-not-stored'),
        label,
      ).toEqual([]);
    });
  });
});
