// @koa/bodyparser and koa-body (co-body underneath both, formidable under koa-body's multipart) for
// real behind the middleware, as the Koa guide mounts them: every way they refuse a request's own
// body is told from a handler's outcome, so the refusal is not stored, the key is released, and the
// retry with the body fixed runs. express.test.ts does the same for body-parser.
import { Buffer } from 'node:buffer';
import { gzipSync } from 'node:zlib';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { multipartForm } from '@idem/testkit';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/idempotency.js';
import { listen } from './support.js';

// Loaded by specifiers TypeScript does not follow: the declarations of both add `body` to every
// `http.IncomingMessage`, which would retype `req.body` for the Express code this repository
// type-checks in the same project.
const modules: string[] = ['@koa/bodyparser', 'koa-body'];
const [{ bodyParser }, { koaBody }] = (await Promise.all(modules.map((name) => import(name)))) as [
  { bodyParser: (options: { jsonLimit?: number }) => Koa.Middleware },
  {
    koaBody: (options: {
      jsonLimit?: number;
      multipart?: boolean;
      formidable?: { maxFileSize?: number };
    }) => Koa.Middleware;
  },
];

// Each parser as the Koa guide mounts it, after the middleware, with a JSON limit of 60 bytes.
const parsers: Array<[string, () => Koa.Middleware]> = [
  ['@koa/bodyparser', () => bodyParser({ jsonLimit: 60 })],
  ['koa-body', () => koaBody({ jsonLimit: 60, multipart: true, formidable: { maxFileSize: 100 } })],
];

const json = { 'content-type': 'application/json' };

interface Refused {
  name: string;
  headers: Record<string, string>;
  body: Buffer;
  /** The status @koa/bodyparser's refusal gets from Koa. */
  status: number;
}

const refusals: Refused[] = [
  { name: 'malformed JSON', headers: json, body: Buffer.from('{"amount":'), status: 400 },
  {
    name: 'malformed JSON, declared latin1 (co-body reads it as UTF-8)',
    headers: { 'content-type': 'application/json; charset=iso-8859-1' },
    body: Buffer.from([0x7b, 0x22, 0xe9, 0x22, 0x3a]),
    status: 400,
  },
  {
    name: 'malformed JSON, gzip',
    headers: { ...json, 'content-encoding': 'gzip' },
    body: gzipSync('{"amount":'),
    status: 400,
  },
  { name: 'over jsonLimit', headers: json, body: Buffer.from(`{"note":"${'x'.repeat(80)}"}`), status: 413 },
  {
    name: 'over jsonLimit, gzip',
    headers: { ...json, 'content-encoding': 'gzip' },
    body: gzipSync(`{"note":"${'x'.repeat(80)}"}`),
    status: 413,
  },
  // inflation and zlib: co-body passes the decoder's error on with no status, which Koa answers 500.
  {
    name: 'gzip that is no gzip',
    headers: { ...json, 'content-encoding': 'gzip' },
    body: Buffer.from('{"amount":1} not gzip'),
    status: 500,
  },
  {
    name: 'gzip cut short',
    headers: { ...json, 'content-encoding': 'gzip' },
    body: gzipSync('{"amount":1}').subarray(0, 12),
    status: 500,
  },
  {
    name: 'br that is no br',
    headers: { ...json, 'content-encoding': 'br' },
    body: Buffer.from('{"amount":1} not br'),
    status: 500,
  },
  {
    name: 'a coding inflation does not take',
    headers: { ...json, 'content-encoding': 'compress' },
    body: Buffer.from('{"amount":1}'),
    status: 415,
  },
];

// An upload of one file of `size` bytes (and a text field).
function upload(size: number): { headers: Record<string, string>; body: Buffer } {
  const { body, contentType } = multipartForm('idem-boundary', Buffer.alloc(size, 7));
  return { headers: { 'content-type': contentType }, body };
}
describe.each(parsers)('%s behind the idempotency middleware', (name, parser) => {
  // koa-body's multipart is formidable's: a file over maxFileSize is its 413, with no status Koa
  // reads, so Koa answers 500.
  const cases =
    name === 'koa-body'
      ? [
          ...refusals,
          (() => {
            return { name: 'a file over maxFileSize', ...upload(500), status: 500 };
          })(),
        ]
      : refusals;

  it("every refusal of the request's own body is not stored: the key is released and the fixed retry runs", async () => {
    const events: IdempotencyEvent[] = [];
    const app = new Koa();
    app.silent = true;
    let runs = 0;
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', onEvent: (event) => events.push(event) }));
    app.use(parser());
    app.use(async (ctx) => {
      ctx.status = 201;
      ctx.body = { run: ++runs, amount: (ctx.request as { body?: { amount?: number } }).body?.amount };
    });
    await listen(app, async (url) => {
      for (const [i, refused] of cases.entries()) {
        const key = `refused-${i}`;
        const sent = (headers: Record<string, string>, body: Buffer) =>
          fetch(url, { method: 'POST', headers: { ...headers, 'idempotency-key': key }, body: new Uint8Array(body) });
        const answer = await sent(refused.headers, refused.body);
        expect(answer.status, refused.name).toBe(refused.status);
        expect(answer.headers.get('idempotency-key'), refused.name).toBeNull();
        const retry = await sent(json, Buffer.from('{"amount":1}'));
        expect(retry.status, refused.name).toBe(201);
        expect(await retry.json(), refused.name).toEqual({ run: i + 1, amount: 1 });
      }
      expect(runs).toBe(cases.length);
    });
    expect(events.filter((event) => event.type === 'response-not-stored')).toEqual(
      cases.map((refused) => expect.objectContaining({ reason: 'body-refused', status: refused.status })),
    );
  });
});
