import { createRequire } from 'node:module';
import { memoryStore } from '@idem/core';
import fc from 'fast-check';
import Fastify from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, fastifyWebhook } from '../src/index.js';

// Fastify's own reader of a Content-Type, the one that answers 415 before any parser runs.
const ContentType = createRequire(import.meta.url)('fastify/lib/content-type.js') as new (
  value: string,
) => { isValid: boolean };

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded"}');

// Characters that decide Fastify's reading: token characters, the separators it looks for, the
// whitespace it trims, and bytes a header can carry that are neither (quotes, commas, Latin-1).
const alphabet = [
  ..."aZ09.+-_!#$%&'*^`|~",
  '/',
  ';',
  ',',
  '=',
  '"',
  '\\',
  ' ',
  '\t',
  '(',
  ')',
  '@',
  ':',
  '?',
  '[',
  ']',
  '{',
  '}',
  '\u00a0',
  '\u00e9',
  '\u00ff',
  '\u0085',
];
const contentTypes = fc.oneof(
  fc.string({ unit: fc.constantFrom(...alphabet), maxLength: 14 }),
  fc
    .tuple(
      fc.string({ unit: fc.constantFrom(...alphabet), maxLength: 5 }),
      fc.constantFrom('application', 'text', ' application', 'Application'),
      fc.constantFrom('/', ' /', '/ ', '//'),
      fc.constantFrom('json', 'JSON', 'json ', 'json\t', 'vnd.a+json', ''),
      fc.string({ unit: fc.constantFrom(...alphabet), maxLength: 8 }),
    )
    .map((parts) => parts.join('')),
  fc.constantFrom('undefined', 'Undefined', '', ' ', 'application/json', 'application/json; charset=utf-8'),
);

describe('fastify glue: the Content-Type the plugin drops is the one Fastify cannot read', () => {
  const seen: (string | undefined)[] = [];
  const app = Fastify();
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: () => undefined,
  });
  const handle = receiver.handle.bind(receiver);
  receiver.handle = (request) => {
    seen.push((request.headers as Record<string, string | undefined>)['content-type']);
    return handle(request);
  };
  app.register(fastifyWebhook(receiver, { path: '/hooks' }));
  app.post('/other', async () => 'ok');
  beforeAll(() => app.ready());
  afterAll(() => app.close());

  let n = 0;
  it('every Content-Type Fastify can read reaches the receiver as sent, every other is dropped; each delivery is 200, never a 415 (2,000 values)', async () => {
    await fc.assert(
      fc.asyncProperty(contentTypes, async (type) => {
        seen.length = 0;
        const headers = signer.sign({ id: `ct_${n++}`, body, timestamp: new Date() });
        const response = await app.inject({
          method: 'POST',
          url: '/hooks',
          headers: { ...headers, 'content-type': type },
          payload: body,
        });
        expect(response.statusCode).toBe(200);
        expect(seen).toEqual([new ContentType(type).isValid ? type : undefined]);
      }),
      { numRuns: 2000 },
    );
  });

  it("a route outside the plugin keeps Fastify's own reading: 415 FST_ERR_CTP_INVALID_MEDIA_TYPE for a Content-Type it cannot read", async () => {
    const response = await app.inject({
      method: 'POST',
      url: '/other',
      headers: { 'content-type': 'json' },
      payload: body,
    });
    expect(response.statusCode).toBe(415);
    expect(response.json()).toMatchObject({ code: 'FST_ERR_CTP_INVALID_MEDIA_TYPE' });
  });

  // Was wrong: an app hook that sets `request.headers` (Fastify's setter: every read then merges a
  // fresh copy over the raw headers) made the plugin drop the Content-Type from a copy, and Fastify
  // still answered its own 415.
  it('a Content-Type Fastify cannot read is dropped also after an app hook set request.headers', async () => {
    const hooked = Fastify();
    hooked.addHook('onRequest', async (request) => {
      request.headers = { 'x-tenant': 'a' };
    });
    hooked.register(fastifyWebhook(receiver, { path: '/hooks' }));
    try {
      const headers = signer.sign({ id: `ct_${n++}`, body, timestamp: new Date() });
      const response = await hooked.inject({
        method: 'POST',
        url: '/hooks',
        headers: { ...headers, 'content-type': 'json' },
        payload: body,
      });
      expect(response.statusCode).toBe(200);
    } finally {
      await hooked.close();
    }
  });
});
