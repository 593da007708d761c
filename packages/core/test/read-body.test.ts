import { once } from 'node:events';
import { Agent, createServer, type IncomingMessage, request } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as zlib from 'node:zlib';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import { readBodyForFingerprint } from '../src/http-body.js';

// A request whose body an earlier parser already read to its end.
const drained = () => ({ headers: { 'content-length': '12' }, readableEnded: true }) as unknown as IncomingMessage;

describe('readBodyForFingerprint', () => {
  it('reads the raw bytes when nobody read them yet, and leaves them for the next reader', async () => {
    const seen: unknown[] = [];
    const server = createServer(async (req, res) => {
      seen.push(await readBodyForFingerprint(req, 1_024, { body: { ignored: true } }));
      seen.push((await buffer(req)).toString());
      res.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      await fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{"amount":1}' });
    } finally {
      server.close();
    }
    expect(seen).toEqual([{ ok: true, body: Buffer.from('{"amount":1}') }, '{"amount":1}']);
  });

  it('after a parser: its raw bytes or text first, then its parsed body as it is', async () => {
    const bytes = Buffer.from('{"amount":1}');
    expect(await readBodyForFingerprint(drained(), 1_024, { rawBody: bytes, body: {} })).toEqual({
      ok: true,
      body: bytes,
    });
    expect(await readBodyForFingerprint(drained(), 1_024, { rawBody: 'a=1' })).toEqual({
      ok: true,
      body: Buffer.from('a=1'),
    });
    expect(await readBodyForFingerprint(drained(), 1_024, { body: 'text' })).toEqual({
      ok: true,
      body: Buffer.from('text'),
    });
    expect(await readBodyForFingerprint(drained(), 1_024, {})).toEqual({ ok: true, body: undefined });
    const parsed = { amount: 1, items: [{ b: 2, a: 1 }] };
    const read = await readBodyForFingerprint(drained(), 1_024, { body: parsed });
    expect(read).toEqual({ ok: true, body: undefined, json: parsed });
    // The parsed body fingerprints as its raw bytes would.
    if (!read.ok) return;
    const parts = { method: 'POST', route: '/c', path: '/c', contentType: 'application/json' };
    expect(fingerprintRequest({ ...parts, body: read.body, json: read.json })).toBe(
      fingerprintRequest({ ...parts, body: '{ "items": [{"a":1,"b":2}], "amount": 1 }' }),
    );
  });

  it('after a JSON parser, a string body is the JSON string it parsed, not the text of another body', async () => {
    const drainedJson = () =>
      ({
        headers: { 'content-length': '5', 'content-type': 'application/json; charset=utf-8' },
        readableEnded: true,
      }) as unknown as IncomingMessage;
    const parts = { method: 'POST', route: '/c', path: '/c', contentType: 'application/json' };
    const fingerprintOf = async (body: unknown) => {
      const read = await readBodyForFingerprint(drainedJson(), 1_024, { body });
      if (!read.ok) throw new Error('not read');
      return fingerprintRequest({ ...parts, body: read.body, json: read.json });
    };
    expect(await readBodyForFingerprint(drainedJson(), 1_024, { body: '123' })).toEqual({
      ok: true,
      body: undefined,
      json: '123',
    });
    // The JSON string "123" (express.json({ strict: false }), Fastify) and the number 123 are two requests;
    // so are a string that spells a JSON object and that object. Each agrees with its raw bytes.
    expect(await fingerprintOf('123')).not.toBe(await fingerprintOf(123));
    expect(await fingerprintOf('123')).toBe(fingerprintRequest({ ...parts, body: '"123"' }));
    expect(await fingerprintOf(123)).toBe(fingerprintRequest({ ...parts, body: '123' }));
    expect(await fingerprintOf('{"amount":1}')).not.toBe(await fingerprintOf({ amount: 1 }));
    expect(await fingerprintOf('{"amount":1}')).toBe(fingerprintRequest({ ...parts, body: '"{\\"amount\\":1}"' }));
    expect(await fingerprintOf('')).toBe(fingerprintRequest({ ...parts, body: '""' }));
  });

  it('refuses a declared length over the limit before reading (413)', async () => {
    const read = await readBodyForFingerprint(drained(), 4, { body: {} });
    expect(read.ok).toBe(false);
    if (!read.ok) expect(read.error.status).toBe(413);
  });

  it('takes a body cut off mid-upload for an incomplete body (400), never for an empty one', async () => {
    let read: Promise<unknown> | undefined;
    const server = createServer((req) => {
      read = readBodyForFingerprint(req, 1_024, {});
    });
    const arrived = once(server, 'request');
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
      await once(socket, 'connect');
      socket.write(
        'POST /c HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 35\r\n\r\n{"amount"',
      );
      await arrived;
      socket.destroy();
      // Read as no body, it claimed the key with the wrong fingerprint, and the real retry got 422.
      expect(await read).toMatchObject({ ok: false, error: { code: 'body_incomplete', status: 400, retryable: true } });
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('drains a chunked body over the limit, so the kept-alive connection serves the next request', async () => {
    const server = createServer(async (req, res) => {
      const read = await readBodyForFingerprint(req, 1_024, {});
      res.writeHead(read.ok ? 200 : read.error.status).end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const send = (body: Readable | string) =>
      new Promise<{ status: number | undefined; socket: unknown }>((resolve, reject) => {
        const req = request({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', method: 'POST', agent });
        req.on('response', (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode, socket: req.socket }));
        });
        req.on('error', reject);
        if (typeof body === 'string') req.end(body);
        else body.pipe(req);
      });
    try {
      // No Content-Length: the limit is only found while reading. 256 KiB, in 1 KiB chunks.
      const big = Readable.from(Array.from({ length: 256 }, () => Buffer.alloc(1_024, 0x61)));
      const first = await send(big);
      const second = await send('{"amount":1}');
      expect([first.status, second.status]).toEqual([413, 200]);
      expect(second.socket).toBe(first.socket);
    } finally {
      agent.destroy();
      server.closeAllConnections();
      server.close();
    }
  });

  it('reads a compressed body as what it says: gzip, deflate, br and zstd, up to the limit', async () => {
    const seen: unknown[] = [];
    const server = createServer(async (req, res) => {
      seen.push(await readBodyForFingerprint(req, 1_024, {}));
      res.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const json = Buffer.from('{"amount":1}');
    const later = gzipSync(json);
    later.writeUInt32LE(1_700_000_000, 4); // gzip's header MTIME: the same JSON compressed again
    const send = (body: Buffer, encoding: string) =>
      fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, {
        method: 'POST',
        headers: { 'content-encoding': encoding },
        body: new Uint8Array(body),
      });
    try {
      await send(gzipSync(json), 'gzip');
      await send(later, 'x-gzip');
      await send(deflateSync(json), 'Deflate');
      await send(brotliCompressSync(json), 'br');
      // zstd where the runtime has it (Node 22.15 and later); the same plain body stands in elsewhere.
      if (zlib.zstdCompressSync) await send(zlib.zstdCompressSync(json), 'zstd');
      else await send(json, 'identity');
      await send(Buffer.from('not gzip'), 'gzip');
      // 2 KiB of zeros shrink to a few bytes: the read stops at the limit, it does not expand them.
      await send(gzipSync(Buffer.alloc(2_048)), 'gzip');
    } finally {
      server.close();
    }
    const decoded = { ok: true, body: json };
    expect(seen.slice(0, 5)).toEqual([decoded, decoded, decoded, decoded, decoded]);
    // What does not decode is fingerprinted as it came (the parser will refuse it).
    expect(seen[5]).toEqual({ ok: true, body: Buffer.from('not gzip') });
    expect(seen[6]).toMatchObject({ ok: false, error: { code: 'body_too_large', status: 413 } });
  });
});
