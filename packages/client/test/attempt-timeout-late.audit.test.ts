// Adversarial review of the attempt timeout that now aborts one timer later (after the event loop's
// I/O phase): it must still bound every attempt, on real timers and on fake ones, and leave no timer.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createClient } from '@idem/client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { failure } from './support/failure.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('the attempt timeout, one timer late', () => {
  it('bounds an attempt to a server that never answers (real timers, real socket)', async () => {
    const server: Server = createServer(() => undefined);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const client = createClient({
        baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        retry: { maxAttempts: 1, timeout: '200ms' },
      });
      const started = performance.now();
      const error = await failure(client.get('/hangs'));
      expect(error.code).toBe('attempts_exhausted');
      // Generous: a loaded CI box; without the timeout this would wait for the test's own limit.
      expect(performance.now() - started).toBeLessThan(5_000);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('bounds an attempt under fake timers, with a fetch that ignores its signal, and leaves no timer', async () => {
    vi.useFakeTimers();
    let calls = 0;
    const client = createClient({
      baseUrl: 'http://api.test',
      fetch: () => {
        calls++;
        return new Promise<Response>(() => undefined);
      },
      retry: { maxAttempts: 1, timeout: '1s' },
    });
    const outcome = failure(client.get('/hangs'));
    await vi.advanceTimersByTimeAsync(999);
    let settled = false;
    void outcome.then(() => {
      settled = true;
    });
    await vi.advanceTimersByTimeAsync(0);
    expect(settled).toBe(false);
    await vi.advanceTimersByTimeAsync(5);
    expect((await outcome).code).toBe('attempts_exhausted');
    expect(calls).toBe(1);
    expect(vi.getTimerCount()).toBe(0);
  });
});
