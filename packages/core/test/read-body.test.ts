import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buffer } from 'node:stream/consumers';
import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import { readBodyForFingerprint } from '../src/http.js';

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

  it('refuses a declared length over the limit before reading (413)', async () => {
    const read = await readBodyForFingerprint(drained(), 4, { body: {} });
    expect(read.ok).toBe(false);
    if (!read.ok) expect(read.error.status).toBe(413);
  });
});
