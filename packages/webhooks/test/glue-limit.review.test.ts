// Review: the glue's `limit` is a security bound; one that is not a byte count must not switch it off.
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import {
  createReceiver,
  createSigner,
  decodeBody,
  expressWebhook,
  fastifyWebhook,
  fastifyWebhookHandler,
  fetchWebhook,
  koaWebhook,
} from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const receiver = () =>
  createReceiver({ store: memoryStore(), secret: SECRET, apply: () => undefined, onWarning: () => undefined });

// What an Express habit (`express.raw({ limit: '1mb' })`) or a miscomputed number gives a JS caller.
const badLimits = ['1mb', Number.NaN, -1, 1.5, Number.POSITIVE_INFINITY] as unknown as number[];

describe('glue limit', () => {
  it.each(badLimits)('refuses limit %s when the glue is built (a TypeError), in every framework', (limit) => {
    const r = receiver();
    expect(() => expressWebhook(r, { limit })).toThrow(TypeError);
    expect(() => koaWebhook(r, { limit })).toThrow(TypeError);
    expect(() => fetchWebhook(r, { limit })).toThrow(TypeError);
    expect(() => fastifyWebhookHandler(r, { limit })).toThrow(TypeError);
    expect(() => fastifyWebhook(r, { path: '/hooks', limit })).toThrow(TypeError);
  });

  // Was a defect: the glue factories took any option name, so `bodyLimit` (Fastify's own name) or
  // `onMisconfigure` was ignored and its default used in silence, where createReceiver and the
  // sender refuse an unknown name.
  it('refuses an unknown option name, with the near one, and a non-function onMisconfigured, in every framework', () => {
    const r = receiver();
    const unknown = { bodyLimit: 1024 } as never;
    for (const build of [
      () => expressWebhook(r, unknown),
      () => koaWebhook(r, unknown),
      () => fetchWebhook(r, unknown),
      () => fastifyWebhookHandler(r, unknown),
      () => fastifyWebhook(r, { path: '/hooks', ...(unknown as object) }),
    ]) {
      expect(build).toThrow(/unknown option "bodyLimit"/);
    }
    expect(() => expressWebhook(r, { onMisconfigure: () => undefined } as never)).toThrow(
      /did you mean "onMisconfigured"/,
    );
    expect(() => koaWebhook(r, { onMisconfigured: 'log' } as never)).toThrow(TypeError);
    // Each glue's own option is known to it, and only to it.
    expect(() => koaWebhook(r, { path: '/hooks', limit: 1024 })).not.toThrow();
    expect(() => fastifyWebhook(r, { path: '/hooks', limit: 1024, onMisconfigured: () => undefined })).not.toThrow();
    expect(() => expressWebhook(r, { path: '/hooks' } as never)).toThrow(/unknown option "path"/);
  });

  it('decodeBody refuses such a limit as readRawBody does, instead of decompressing without one', async () => {
    await expect(decodeBody(Buffer.from('x'), undefined, { limit: '1mb' as unknown as number })).rejects.toThrow(
      TypeError,
    );
  });

  // Before the fix fetchWebhook took a string limit and then compared every size against it: never
  // larger, so any body, compressed or not, was read in whole. A valid limit still bounds it.
  it('fetchWebhook with a valid limit stops a body over it', async () => {
    const r = receiver();
    const handle = fetchWebhook(r, { limit: 1024 });
    const body = Buffer.alloc(4096, 0x61);
    const headers = createSigner({ secret: SECRET }).sign({ id: 'evt_big', body, timestamp: new Date() });
    const response = await handle(
      new Request('https://receiver.test/hooks', { method: 'POST', headers, body: new Uint8Array(body) }),
    );
    expect(response.status).toBe(413);
  });
});
