// Audit (internationalisation): webhook payloads and headers outside ASCII, sent by the real sender
// over HTTP to the Express glue and a receiver. The signature is over the bytes sent, so they arrive
// and verify exactly; a payload decoded and encoded again on the way is refused, never applied.
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiver, createSender, createSigner, expressWebhook, type ReceivedEvent } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

const applied: Array<{ event: ReceivedEvent; headers: Record<string, string | string[] | undefined> }> = [];
let lastHeaders: Record<string, string | string[] | undefined> = {};
let url: string;
let server: ReturnType<typeof createServer>;

beforeAll(async () => {
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => {
      applied.push({ event, headers: lastHeaders });
    },
  });
  const handle = expressWebhook(receiver);
  server = createServer((req, res) => {
    lastHeaders = req.headers;
    void handle(req, res);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
});

afterAll(() => {
  server.closeAllConnections();
  server.close();
});

const sender = () => createSender({ secret: SECRET, schedule: { maxAttempts: 1 } });

describe('non-ASCII webhook payloads', () => {
  it.each([
    ['UTF-8 JSON with emoji, CJK and NFD text', Buffer.from('{"name":"Zoe\u0308 Åström","city":"東京","note":"🎉"}')],
    ['a Shift_JIS text body (no UTF-8 at all)', Buffer.from([0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea])],
    ['a UTF-8 BOM before the JSON', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"a":"ü"}')])],
  ])('%s arrives and is applied byte for byte', async (what, body) => {
    const id = `evt_${applied.length + 1}`;
    const result = await sender().send({ url, id, body, contentType: 'application/json; charset=utf-8' });
    expect(result.outcome, what).toBe('delivered');
    const last = applied.at(-1);
    expect(last?.event.id).toBe(id);
    expect(Buffer.from(last?.event.body ?? [])).toEqual(body);
  });

  it('a string body is sent as its UTF-8 bytes, and json() gives back the same strings', async () => {
    const event = { type: 'payment.succeeded', data: { payer: 'Zoë Åström', memo: '日本語 🎉', nfd: 'e\u0301' } };
    const result = await sender().send({ url, id: 'evt_string', body: JSON.stringify(event) });
    expect(result.outcome).toBe('delivered');
    const last = applied.at(-1);
    expect(Buffer.from(last?.event.body ?? [])).toEqual(Buffer.from(JSON.stringify(event), 'utf8'));
    expect(last?.event.json()).toEqual(event);
  });

  it('a latin1 header value goes out as its byte; one no byte can carry is refused before any attempt', async () => {
    const result = await sender().send({ url, id: 'evt_header', body: '{}', headers: { 'x-tenant': 'Zürich' } });
    expect(result.outcome).toBe('delivered');
    // Node hands request header bytes over as latin1: the one byte 0xFC came.
    expect(applied.at(-1)?.headers['x-tenant']).toBe('Zürich');
    await expect(sender().send({ url, id: 'evt_cjk', body: '{}', headers: { 'x-city': '東京' } })).rejects.toThrow(
      TypeError,
    );
  });

  it('the same text encoded again differently (NFC for NFD, no BOM) fails the signature and is not applied', async () => {
    const signed = Buffer.from('{"name":"Zoe\u0308"}');
    const headers = createSigner({ secret: SECRET }).sign({ id: 'evt_reencoded', body: signed, timestamp: new Date() });
    const before = applied.length;
    for (const body of [Buffer.from('{"name":"Zoë"}'), Buffer.from('{"name":"Zoe\u0308"}', 'latin1')]) {
      const response = await fetch(url, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json' },
        body,
      });
      expect(response.status).toBe(400);
      expect(((await response.json()) as { code: string }).code).toBe('signature_mismatch');
    }
    expect(applied.length).toBe(before);
  });
});
