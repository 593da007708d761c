import { createClient } from '@idem/client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { empty, scriptedFetch } from './support/fake-fetch.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('the deadline when the wall clock steps', () => {
  // Was a defect: the deadline was `Date.now() + deadline`, so a wall clock stepped forward during
  // the backoff (NTP, a resumed laptop) ended the operation with deadline_exceeded before its retry.
  it('a forward step of an hour during the backoff does not end a 60 s deadline', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const { fetch, seen } = scriptedFetch([empty(503), empty(201)]);
    const client = createClient({
      baseUrl: 'https://api.example.test',
      fetch,
      random: () => 0,
      sleep: async () => {
        vi.setSystemTime(Date.now() + 3_600_000);
      },
      retry: { maxAttempts: 3, deadline: '60s' },
    });
    const result = await client.post('/charges', {});
    expect(result.status).toBe(201);
    expect(seen).toHaveLength(2);
  });
});
