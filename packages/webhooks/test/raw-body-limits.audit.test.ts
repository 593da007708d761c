import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import vm from 'node:vm';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import {
  createReceiver,
  createSigner,
  decodeBody,
  expressWebhook,
  fastifyWebhookHandler,
  readRawBody,
  type WebhookError,
} from '../src/index.js';

// Mutation pass over the raw-body reading and the glue's placeholder checks: the limit is the largest
// body accepted (a body of exactly `limit` bytes passes), encodings are matched as HTTP matches
// them, and a body object that is not an unread placeholder fails closed.

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });

/** A request stream nobody read yet, with the given headers. */
function request(chunks: Buffer[], headers: Record<string, string> = {}): IncomingMessage {
  return Object.assign(Readable.from(chunks), { headers }) as unknown as IncomingMessage;
}

const bytes = (length: number) => Buffer.alloc(length, 0x61);

async function refusal(work: Promise<unknown>): Promise<string | undefined> {
  try {
    await work;
    return undefined;
  } catch (error) {
    return (error as WebhookError).code;
  }
}

describe('raw body limit: the largest body accepted, not the first one refused', () => {
  it('readRawBody takes a body of exactly `limit` bytes, declared or not, and refuses one byte more', async () => {
    const declared = await readRawBody(request([bytes(64)], { 'content-length': '64' }), { limit: 64 });
    expect(declared.length).toBe(64);
    const chunked = await readRawBody(request([bytes(32), bytes(32)]), { limit: 64 });
    expect(chunked.length).toBe(64);
    expect(await refusal(readRawBody(request([bytes(65)], { 'content-length': '65' }), { limit: 64 }))).toBe(
      'body_too_large',
    );
    expect(await refusal(readRawBody(request([bytes(32), bytes(33)]), { limit: 64 }))).toBe('body_too_large');
  });

  it('readRawBody takes a gzip body that expands to exactly `limit` bytes, and refuses one that expands past it', async () => {
    const exact = await readRawBody(request([gzipSync(bytes(64))], { 'content-encoding': 'gzip' }), { limit: 64 });
    expect(exact.equals(bytes(64))).toBe(true);
    expect(
      await refusal(readRawBody(request([gzipSync(bytes(65))], { 'content-encoding': 'gzip' }), { limit: 64 })),
    ).toBe('body_too_large');
  });

  it('decodeBody returns an identity body of exactly `limit` bytes and refuses one byte more', async () => {
    expect((await decodeBody(bytes(64), undefined, { limit: 64 })).length).toBe(64);
    expect(await refusal(decodeBody(bytes(65), undefined, { limit: 64 }))).toBe('body_too_large');
  });
});

describe('content codings are matched as HTTP matches them', () => {
  it("decodes 'x-gzip' (RFC 9110 8.4.1.3) and a coding in any case, with spaces around", async () => {
    const wire = gzipSync(Buffer.from('{"ok":true}'));
    for (const coding of ['x-gzip', ' GZip ', 'X-GZIP']) {
      const read = await readRawBody(request([wire], { 'content-encoding': coding }));
      expect(read.toString(), coding).toBe('{"ok":true}');
      expect((await decodeBody(wire, coding)).toString(), coding).toBe('{"ok":true}');
    }
  });
});

/** A ServerResponse stand-in that keeps what was written. */
function response() {
  const sent = { status: 0, headers: {} as Record<string, string>, body: Buffer.alloc(0) as Buffer };
  const res = {
    headersSent: false,
    destroyed: false,
    set statusCode(status: number) {
      sent.status = status;
    },
    setHeader(name: string, value: string) {
      sent.headers[name.toLowerCase()] = value;
    },
    end(body?: Buffer) {
      if (body) sent.body = body;
    },
  };
  return { res: res as unknown as ServerResponse, sent };
}

function receiver() {
  const applied: string[] = [];
  const made = createReceiver({ store: memoryStore(), secret: SECRET, apply: (event) => void applied.push(event.id) });
  return { receiver: made, applied };
}

describe('express glue: only an unread, empty, unflagged `{}` is a placeholder', () => {
  const payload = Buffer.from('{"type":"payment.succeeded"}');

  it('fails closed on a parsed object with one member, even over a stream nobody read', async () => {
    const { receiver: made, applied } = receiver();
    const req = Object.assign(
      request([payload], { ...signer.sign({ id: 'evt_one', body: payload, timestamp: new Date() }) }),
      { body: { type: 'payment.succeeded' } },
    );
    const { res, sent } = response();
    await expressWebhook(made, { onMisconfigured: () => {} })(req, res);
    expect(sent.status).toBe(500);
    expect(JSON.parse(sent.body.toString()).code).toBe('raw_body_required');
    expect(applied).toEqual([]);
  });

  it('fails closed on `{}` that a parser flagged as its own (`req._body`), even over a stream nobody read', async () => {
    const { receiver: made, applied } = receiver();
    const req = Object.assign(
      request([payload], { ...signer.sign({ id: 'evt_flag', body: payload, timestamp: new Date() }) }),
      { body: {}, _body: true },
    );
    const { res, sent } = response();
    await expressWebhook(made, { onMisconfigured: () => {} })(req, res);
    expect(sent.status).toBe(500);
    expect(JSON.parse(sent.body.toString()).code).toBe('raw_body_required');
    expect(applied).toEqual([]);
  });

  it('reads the stream under an unflagged `{}` (the control case)', async () => {
    const { receiver: made, applied } = receiver();
    const req = Object.assign(
      request([payload], { ...signer.sign({ id: 'evt_skip', body: payload, timestamp: new Date() }) }),
      { body: {} },
    );
    const { res, sent } = response();
    await expressWebhook(made)(req, res);
    expect(sent.status).toBe(200);
    expect(applied).toEqual(['evt_skip']);
  });

  // Was wrong: only this realm's `{}` was a placeholder, so the `{}` of a parser running in another
  // realm (a node:vm context, a sandboxed app) failed every delivery closed with 500 although the
  // stream was still unread. The prototype test is core's `isPlainObject`, which knows any realm's.
  it("reads the stream under another realm's unflagged `{}`", async () => {
    const { receiver: made, applied } = receiver();
    const placeholder: unknown = vm.runInNewContext('({})');
    expect(Object.getPrototypeOf(placeholder)).not.toBe(Object.prototype);
    const req = Object.assign(
      request([payload], { ...signer.sign({ id: 'evt_realm', body: payload, timestamp: new Date() }) }),
      { body: placeholder },
    );
    const { res, sent } = response();
    await expressWebhook(made)(req, res);
    expect(sent.status).toBe(200);
    expect(applied).toEqual(['evt_realm']);
  });

  it.each([
    ['an empty class instance of another realm', () => vm.runInNewContext('new (class Parsed {})()')],
    ['an empty Map of another realm', () => vm.runInNewContext('new Map()')],
    ['an object over an empty plain object', () => Object.create({})],
  ])('fails closed on %s, even over a stream nobody read', async (_what, make) => {
    const { receiver: made, applied } = receiver();
    const req = Object.assign(
      request([payload], { ...signer.sign({ id: 'evt_other', body: payload, timestamp: new Date() }) }),
      { body: make() as unknown },
    );
    const { res, sent } = response();
    await expressWebhook(made, { onMisconfigured: () => {} })(req, res);
    expect(sent.status).toBe(500);
    expect(JSON.parse(sent.body.toString()).code).toBe('raw_body_required');
    expect(applied).toEqual([]);
  });
});

describe('fastify handler', () => {
  it('takes an unparsed body declared `content-length: 0` as the empty body, not as a parsed one', async () => {
    const { receiver: made, applied } = receiver();
    const empty = Buffer.alloc(0);
    const headers = { 'content-length': '0', ...signer.sign({ id: 'evt_empty', body: empty, timestamp: new Date() }) };
    const sent = { status: 0 };
    const reply = {
      code(status: number) {
        sent.status = status;
        return reply;
      },
      header: () => reply,
      send: (payload: Buffer) => payload,
    };
    await fastifyWebhookHandler(made)({ headers }, reply);
    expect(sent.status).toBe(200);
    expect(applied).toEqual(['evt_empty']);
  });
});
