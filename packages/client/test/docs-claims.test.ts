// docs/client.md claims that no test held (docs audit of 2026-12).
import { createClient, isRequestFailedError } from '@idem/client';
import { describe, expect, it } from 'vitest';
import { json, scriptedFetch } from './support/fake-fetch.js';
import { fakeTime, seededRandom } from './support/fake-time.js';

describe('docs/client.md: what is retried', () => {
  // docs/client.md, "What is retried": "The decision reads the body's bytes, whatever `parse` keeps of
  // them, except with `parse: 'none'`, where the body is not read and the status decides."
  it("with parse: 'none' a problem saying retryable: false is not read, and the status decides (a keyed 409 is retried)", async () => {
    const time = fakeTime();
    const problem = { 'content-type': 'application/problem+json' };
    const { fetch, seen } = scriptedFetch([
      json(409, { code: 'seat_taken', retryable: false }, problem),
      json(201, {}),
    ]);
    const client = createClient({
      baseUrl: 'https://api.example.test/',
      fetch,
      random: seededRandom(7),
      sleep: time.sleep,
      now: time.now,
    });
    const result = await client.post('/bookings', {}, { parse: 'none' });
    expect(result.status).toBe(201);
    expect(seen).toHaveLength(2);
    // The same answer read as bytes is final at once (the pinned counterpart in create-client.test.ts).
    const again = scriptedFetch([json(409, { code: 'seat_taken', retryable: false }, problem), json(201, {})]);
    const reading = createClient({
      baseUrl: 'https://api.example.test/',
      fetch: again.fetch,
      sleep: time.sleep,
      now: time.now,
    });
    const error = await reading.post('/bookings', {}, { parse: 'bytes' }).catch((e: unknown) => e);
    expect(isRequestFailedError(error) && error.code).toBe('http_error');
    expect(again.seen).toHaveLength(1);
  });
});
