// Audit of idem's 400 body_incomplete being retried: parse modes, replays, and what a server that
// is not idem can make the client do with it. Scripted fetch, fake clock: nothing waits.
import { describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { json } from './support/fake-fetch.js';
import { scriptedClient } from './support/scripted-client.js';

const problem = { 'content-type': 'application/problem+json; charset=utf-8' };
const cut = (headers: Record<string, string> = {}) =>
  json(400, { code: 'body_incomplete', retryable: true, status: 400 }, { ...problem, ...headers });

describe("idem's 400 body_incomplete", () => {
  it("is read from the body's bytes whatever `parse` keeps of them, except 'none', where the status decides", async () => {
    for (const parse of ['auto', 'json', 'text', 'bytes'] as const) {
      const { client, seen } = scriptedClient([cut(), json(201, { id: 'ch_1' })]);
      expect((await client.post('/charges', { amount: 1 }, { parse })).status, parse).toBe(201);
      expect(seen, parse).toHaveLength(2);
    }
    const { client, seen } = scriptedClient([cut(), json(201, {})]);
    expect((await failure(client.post('/charges', { amount: 1 }, { parse: 'none' }))).code).toBe('http_error');
    expect(seen).toHaveLength(1);
  });

  it('is final when it comes back replayed: a stored answer is the same on every ask', async () => {
    const { client, seen } = scriptedClient([cut({ 'idempotent-replayed': 'true' }), json(201, {})]);
    expect((await failure(client.post('/charges', { amount: 1 }))).code).toBe('http_error');
    expect(seen).toHaveLength(1);
  });

  it('a server that is not idem can make a read ask again only up to maxAttempts, and never an unkeyed write', async () => {
    const { client, seen } = scriptedClient([cut()]);
    const read = await failure(client.get('/stock', { retry: { maxAttempts: 3 } }));
    expect([read.code, seen.length]).toEqual(['attempts_exhausted', 3]);
    const unkeyed = scriptedClient([cut()]);
    const write = await failure(unkeyed.client.post('/charges', {}, { idempotencyKey: false }));
    expect([write.code, unkeyed.seen.length]).toEqual(['http_error', 1]);
    // Even on a keyed write, where a repeat is harmless: not another status, a code in another
    // member, a bare string body or an array.
    for (const answer of [
      json(422, { code: 'body_incomplete', retryable: true }, problem),
      json(400, { type: 'body_incomplete', retryable: true }, problem),
      json(400, 'body_incomplete', problem),
      json(400, [{ code: 'body_incomplete' }], problem),
    ]) {
      const other = scriptedClient([answer, json(200, {})]);
      const result = await failure(other.client.post('/charges', {}));
      expect(result.code).toBe('http_error');
      expect(other.seen).toHaveLength(1);
    }
  });
});
