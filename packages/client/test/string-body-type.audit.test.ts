// Audit of the client's own type for a string body (text/plain;charset=UTF-8, set since Bun's fetch
// sends none): a type the caller gave, in any case of its name, on the call or the client, stays
// the only one sent; a Blob or bytes get no type from the client.
import { describe, expect, it } from 'vitest';
import { json } from './support/fake-fetch.js';
import { scriptedClient } from './support/scripted-client.js';

describe("a string body's type", () => {
  it.each([
    ['Content-Type', 'application/json'],
    ['content-type', 'application/json'],
    ['CONTENT-TYPE', 'text/csv; charset=utf-8'],
  ])("the caller's %s header wins over the client's text/plain, and is sent once", async (name, type) => {
    const { client, seen } = scriptedClient([json(200, {})]);
    await client.put('/a', '{"a":1}', { headers: { [name]: type } });
    expect(seen[0]?.headers.get('content-type')).toBe(type);
    const names: string[] = [];
    seen[0]?.headers.forEach((_value, key) => {
      names.push(key);
    });
    expect(names.filter((key) => key === 'content-type')).toHaveLength(1);
  });

  it("a client's default type wins over text/plain too", async () => {
    const { client, seen } = scriptedClient([json(200, {})], { headers: { 'Content-Type': 'application/xml' } });
    await client.put('/a', '<a/>');
    expect(seen[0]?.headers.get('content-type')).toBe('application/xml');
  });

  // fetch itself gives a Blob its own type (not seen here: the scripted fetch records the client's headers).
  it('the client sets no type of its own for a Blob or bytes', async () => {
    const { client, seen } = scriptedClient([json(200, {})]);
    await client.put('/a', new Blob(['x'], { type: 'image/png' }));
    await client.put('/b', new Blob(['x']));
    await client.put('/c', new Uint8Array([1, 2]));
    expect(seen.map((request) => request.headers.get('content-type'))).toEqual([null, null, null]);
  });
});
