import { type ClientOptions, createClient } from '@idem/client';
import { describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { json } from './support/fake-fetch.js';
import { scriptedClient } from './support/scripted-client.js';

// Mutation pass over create-client.ts: key handling and the response cap, at edges no other test held.

describe('a key set by hand as a header', () => {
  it('is reported decoded and sent as written', async () => {
    const { client, seen } = scriptedClient([json(201, {})]);
    const result = await client.post('/charges', {}, { headers: { 'idempotency-key': '"k-1"' } });
    expect(result.key).toBe('k-1');
    expect(seen[0]?.headers.get('idempotency-key')).toBe('"k-1"');
  });

  it('is refused when blank, before anything is sent', async () => {
    const { client, seen } = scriptedClient([json(201, {})]);
    await expect(client.post('/charges', {}, { headers: { 'idempotency-key': '  ' } })).rejects.toThrow(TypeError);
    expect(seen).toHaveLength(0);
  });
});

describe('a keyed idempotent write', () => {
  it('takes its 3xx as its answer: a keyed PUT is not sent on to where the redirect points', async () => {
    const urls: string[] = [];
    const fetch: ClientOptions['fetch'] = async (input) => {
      urls.push(input);
      return new Response(null, { status: 307, headers: { location: '/elsewhere' } });
    };
    const client = createClient({ baseUrl: 'https://api.example.test/', fetch });
    const result = await client.put('/settings', { theme: 'dark' }, { idempotencyKey: 'k-put' });
    expect(result.status).toBe(307);
    expect(urls).toEqual(['https://api.example.test/settings']);
  });
});

describe('maxResponseBytes on a cross-origin response', () => {
  it("does not refuse by Content-Length where the coding is hidden (type 'cors'): the bytes read decide", async () => {
    const answer = (type: ResponseType) => () => {
      // Content-Length counts the coded bytes; the decoded body, the one kept, is shorter.
      const response = new Response('ok', { status: 200, headers: { 'content-length': '1000' } });
      Object.defineProperty(response, 'type', { value: type });
      return response;
    };
    const cors = scriptedClient([answer('cors')], { maxResponseBytes: 10 });
    expect((await cors.client.get('/a', { parse: 'text' })).body).toBe('ok');
    // The control: a same-origin response is refused by its declared length.
    const basic = scriptedClient([answer('basic')], { maxResponseBytes: 10 });
    expect((await failure(basic.client.get('/a', { parse: 'text' }))).code).toBe('response_too_large');
  });
});
