// docs/client.md, "In browsers", "A CORS refusal looks exactly like a network error": a browser
// rejects a refused request's `fetch` with the same TypeError as a dropped connection (no status, no
// headers), so the client retries a keyed write until `maxAttempts` and ends `attempts_exhausted`
// with that TypeError as `cause`, after four waits of at most 1, 2, 4 and 8 s with the defaults; an
// unkeyed POST ends at once with `network_error`. Here `fetch` rejects as a browser's does.
import { readFileSync } from 'node:fs';
import { createClient, isRequestFailedError } from '@idem/client';
import { describe, expect, it } from 'vitest';

// What Chromium's fetch rejects with for a CORS refusal (Firefox: "NetworkError when attempting to fetch resource.").
const corsRefusal = () => Promise.reject(new TypeError('Failed to fetch'));

const failure = async (request: Promise<unknown>) => {
  try {
    await request;
  } catch (error) {
    if (isRequestFailedError(error)) return error;
    throw error;
  }
  throw new Error('the request succeeded');
};

describe('a CORS refusal, as the client sees it (docs/client.md)', () => {
  it('a keyed write is retried until attempts_exhausted: five attempts, waits of at most 1, 2, 4 and 8 s', async () => {
    const waits: number[] = [];
    let sent = 0;
    const client = createClient({
      baseUrl: 'https://api.example',
      fetch: () => {
        sent++;
        return corsRefusal();
      },
      // The largest draw: each wait is its ceiling.
      random: () => 1,
      sleep: async (ms) => {
        waits.push(ms);
      },
    });
    const error = await failure(client.post('/charges', { amount: 1 }));
    expect(error.code).toBe('attempts_exhausted');
    expect(error.cause).toBeInstanceOf(TypeError);
    expect(error.status).toBeUndefined();
    expect(sent).toBe(5);
    expect(waits).toEqual([1000, 2000, 4000, 8000]);
  });

  // Was wrong: the page said "about 7 s on average"; full jitter draws each wait uniform in [0, ceiling],
  // so the four waits average half their ceilings: 0.5 + 1 + 2 + 4 = 7.5 s.
  it('the waits before attempts_exhausted average the number the page gives (the mean draw: half of each ceiling)', async () => {
    const page = readFileSync(new URL('../client.md', import.meta.url), 'utf8');
    const documented = Number(/about ([\d.]+) s on average/.exec(page)?.[1]);
    const waits: number[] = [];
    const client = createClient({
      baseUrl: 'https://api.example',
      fetch: corsRefusal,
      random: () => 0.5,
      sleep: async (ms) => {
        waits.push(ms);
      },
    });
    const error = await failure(client.post('/charges', { amount: 1 }));
    expect(error.code).toBe('attempts_exhausted');
    expect(waits).toEqual([500, 1000, 2000, 4000]);
    expect(waits.reduce((a, b) => a + b, 0) / 1000).toBe(documented);
  });

  it('an unkeyed POST ends at once with network_error', async () => {
    let sent = 0;
    const client = createClient({
      baseUrl: 'https://api.example',
      fetch: () => {
        sent++;
        return corsRefusal();
      },
      sleep: async () => undefined,
    });
    const error = await failure(client.post('/charges', { amount: 1 }, { idempotencyKey: false }));
    expect(error.code).toBe('network_error');
    expect(sent).toBe(1);
  });
});
