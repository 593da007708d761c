import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { createReceiver, createSigner, fetchWebhook, type ReceiverEvent, type WebhookError } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');

function setup() {
  const applied: string[] = [];
  const seen: WebhookError[] = [];
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.id),
  });
  const handle = fetchWebhook(receiver, { limit: 2048, onMisconfigured: (error) => seen.push(error) });
  const request = (id: string, wire: Buffer = body, extra: Record<string, string> = {}) =>
    new Request('https://receiver.test/hooks', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...signer.sign({ id, body, timestamp: new Date() }), ...extra },
      body: new Uint8Array(wire),
    });
  return { handle, request, applied, seen };
}

describe('fetch glue', () => {
  it('verifies, applies once and replays the acknowledgement', async () => {
    const { handle, request, applied } = setup();
    const first = await handle(request('E1'));
    expect(first.status).toBe(200);
    expect(await first.json()).toEqual({ received: true });
    const again = await handle(request('E1'));
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(applied).toEqual(['E1']);
  });

  it('decodes gzip, refuses oversize bodies with 413 and unknown encodings with 415', async () => {
    const { handle, request, applied } = setup();
    expect((await handle(request('E2', gzipSync(body), { 'content-encoding': 'gzip' }))).status).toBe(200);
    const big = Buffer.alloc(4096, 0x61);
    expect((await handle(request('E3', gzipSync(big), { 'content-encoding': 'gzip' }))).status).toBe(413);
    expect((await handle(request('E4', body, { 'content-encoding': 'compress' }))).status).toBe(415);
    expect(applied).toEqual(['E2']);
  });

  it('fails closed with raw_body_required when the body was already read', async () => {
    const { handle, request, applied, seen } = setup();
    const used = request('E5');
    await used.json();
    const response = await handle(used);
    expect(response.status).toBe(500);
    expect((await response.json()).code).toBe('raw_body_required');
    expect(seen).toHaveLength(1);
    expect(applied).toEqual([]);
  });

  it('stops reading a body without Content-Length once it passes the limit', async () => {
    const { handle, applied } = setup();
    const chunk = new Uint8Array(1024);
    let pulled = 0;
    // 64 MiB on offer, with no Content-Length to refuse up front.
    const endless = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (pulled >= 64 * 1024 * 1024) controller.close();
        else {
          pulled += chunk.length;
          controller.enqueue(chunk);
        }
      },
    });
    const response = await handle(
      new Request('https://receiver.test/hooks', {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...signer.sign({ id: 'E6', body, timestamp: new Date() }) },
        body: endless,
        duplex: 'half',
      } as RequestInit),
    );
    expect(response.status).toBe(413);
    // The limit is 2 KiB: a few chunks past it at most, never the whole stream.
    expect(pulled).toBeLessThanOrEqual(16 * 1024);
    expect(applied).toEqual([]);
  });

  // docs/webhooks.md: "`onEvent` is called once per delivery", and its table counts the glue's 413,
  // 415 and 500 among the `rejected` ones. The glue answered those itself and told nobody, so a
  // receiver's metrics missed oversize bodies and a misconfigured route (`raw_body_required`).
  it("reports the glue's own refusals through the receiver's onEvent, once each", async () => {
    const events: ReceiverEvent[] = [];
    const receiver = createReceiver({
      store: memoryStore(),
      secret: SECRET,
      apply: () => undefined,
      onEvent: (event) => void events.push(event),
    });
    const handle = fetchWebhook(receiver, { limit: 2048, onMisconfigured: () => undefined });
    const request = (id: string, wire: Buffer, extra: Record<string, string> = {}) =>
      new Request('https://receiver.test/hooks', {
        method: 'POST',
        headers: { ...signer.sign({ id, body, timestamp: new Date() }), ...extra },
        body: new Uint8Array(wire),
      });
    expect((await handle(request('E7', Buffer.alloc(4096, 0x61)))).status).toBe(413);
    expect((await handle(request('E8', body, { 'content-encoding': 'compress' }))).status).toBe(415);
    const used = request('E9', body);
    await used.text();
    expect((await handle(used)).status).toBe(500);
    expect(events.map((event) => ({ type: event.type, code: 'code' in event ? event.code : undefined }))).toEqual([
      { type: 'rejected', code: 'body_too_large' },
      { type: 'rejected', code: 'body_encoding_unsupported' },
      { type: 'rejected', code: 'raw_body_required' },
    ]);
  });

  it('survives an onMisconfigured hook that throws or rejects', async () => {
    for (const onMisconfigured of [
      () => {
        throw new Error('hook bug');
      },
      () => Promise.reject(new Error('hook bug')),
    ]) {
      const receiver = createReceiver({ store: memoryStore(), secret: SECRET, apply: () => undefined });
      const handle = fetchWebhook(receiver, { onMisconfigured });
      const used = new Request('https://receiver.test/hooks', { method: 'POST', body: 'x' });
      await used.text();
      expect((await handle(used)).status).toBe(500);
    }
  });
});
