import { createClient } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { flakyStore, startChargesServer } from './support/charges-server.js';
import { failure } from './support/failure.js';
import { fakeTime, seededRandom } from './support/fake-time.js';

type Server = Awaited<ReturnType<typeof startChargesServer>>;
const servers: Server[] = [];

async function server(options: Parameters<typeof startChargesServer>[0] = {}) {
  const started = await startChargesServer(options);
  servers.push(started);
  return started;
}

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

function client(url: string, time = fakeTime(), extra: Parameters<typeof createClient>[0]['retry'] = {}) {
  return createClient({
    baseUrl: url,
    random: seededRandom(3),
    sleep: time.sleep,
    now: time.now,
    getToken: () => 'user-42.token',
    retry: { timeout: '5s', ...extra },
  });
}

describe('against a real server (node:http + @idem/core engine)', () => {
  it('a response dropped after the server committed is retried with the same key and replayed: one charge', async () => {
    const s = await server({ dropResponses: 1 });
    const result = await client(s.url).post<{ id: string; amount: number }>('/charges', { amount: 500 });
    expect(result.status).toBe(201);
    expect(result.body).toEqual({ id: 'ch_1', amount: 500 });
    expect(result.replayed).toBe(true);
    expect(result.headers.get('location')).toBe('/charges/ch_1');
    expect(result.attempts.map((a) => a.outcome)).toEqual(['network-error', 'response']);
    expect(s.log.map((r) => r.status)).toEqual(['dropped', 201]);
    expect(s.log[0]?.key).toBe(result.key);
    expect(s.log[1]?.key).toBe(result.key);
    expect(s.charges).toHaveLength(1);
  });

  it('a 409 (first request still running) is retried with backoff until the replay', async () => {
    let release: () => void = () => undefined;
    const hold = new Promise<void>((resolve) => {
      release = resolve;
    });
    const s = await server({ holdFirstExecution: hold });
    const key = 'order-7-charge';
    // The "first" attempt of the operation, from another process that is still waiting for it.
    const first = fetch(`${s.url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': `"${key}"`, 'content-type': 'application/json', authorization: 'Bearer user-42.a' },
      body: JSON.stringify({ amount: 700 }),
    });
    await s.firstStarted;

    const time = fakeTime();
    let sleeps = 0;
    time.onSleep(async () => {
      // Two 409s, then the first request finishes during the second wait.
      if (++sleeps === 2) {
        release();
        await first;
      }
    });
    const result = await client(s.url, time).post('/charges', { amount: 700 }, { idempotencyKey: key });
    expect(result.attempts.map((a) => a.status)).toEqual([409, 409, 201]);
    expect(result.replayed).toBe(true);
    expect(result.body).toEqual({ id: 'ch_1', amount: 700 });
    // The engine sends Retry-After: 1 on 409: every wait is at least that, and at most the backoff
    // ceiling or Retry-After and its spread (a fifth of it).
    expect(result.attempts[0]?.retryAfterMs).toBe(1000);
    expect(time.waits).toHaveLength(2);
    expect(time.waits[0]).toBeGreaterThanOrEqual(1000);
    expect(time.waits[0]).toBeLessThanOrEqual(1200);
    expect(time.waits[1]).toBeGreaterThanOrEqual(1000);
    expect(time.waits[1]).toBeLessThanOrEqual(2000);
    expect(s.charges).toHaveLength(1);
  });

  it('a 422 (key reused with another body) is not retried', async () => {
    const s = await server();
    const c = client(s.url);
    const key = 'k-mismatch';
    await c.post('/charges', { amount: 1 }, { idempotencyKey: key });
    const error = await failure(c.post('/charges', { amount: 2 }, { idempotencyKey: key }));
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(422);
    expect(error.attempts).toHaveLength(1);
    expect(error.body).toMatchObject({ code: 'fingerprint_mismatch', retryable: false, status: 422 });
    expect(s.log).toHaveLength(2);
    expect(s.charges).toHaveLength(1);
  });

  it('Retry-After: 3 from the server is respected (503 while its store is down)', async () => {
    const s = await server({ store: flakyStore(1), engine: { unavailableRetryAfter: 3 } });
    const time = fakeTime();
    const result = await client(s.url, time).post('/charges', { amount: 3 });
    expect(result.attempts.map((a) => a.status)).toEqual([503, 201]);
    expect(result.replayed).toBe(false);
    expect(time.waits).toHaveLength(1);
    expect(time.waits[0]).toBeGreaterThanOrEqual(3000);
    expect(time.waits[0]).toBeLessThanOrEqual(3600);
    expect(s.charges).toHaveLength(1);
  });

  it('the total deadline stops the retries', async () => {
    const s = await server({ store: flakyStore(Number.POSITIVE_INFINITY), engine: { unavailableRetryAfter: 2 } });
    const time = fakeTime();
    const error = await failure(
      client(s.url, time, { deadline: '7s', maxAttempts: 50 }).post('/charges', { amount: 1 }),
    );
    expect(error.code).toBe('deadline_exceeded');
    expect(error.status).toBe(503);
    expect(error.body).toMatchObject({ code: 'store_unavailable' });
    // Waits of at least 2 s: attempts at 0, >=2, >=4, >=6 s; the next wait would end past 7 s.
    expect(time.waits.every((w) => w >= 2000)).toBe(true);
    expect(time.waits.reduce((a, b) => a + b, 0)).toBeLessThan(7000);
    expect(s.log.length).toBe(error.attempts.length);
    expect(s.log.length).toBeLessThanOrEqual(4);
    expect(s.charges).toHaveLength(0);
  });

  it('a deadline in real time cuts off a server that never answers', async () => {
    const { createServer } = await import('node:http');
    const silent = createServer(() => undefined);
    silent.listen(0, '127.0.0.1');
    await new Promise((resolve) => silent.once('listening', resolve));
    try {
      const port = (silent.address() as { port: number }).port;
      const c = createClient({ baseUrl: `http://127.0.0.1:${port}`, retry: { deadline: 150, timeout: '10s' } });
      const error = await failure(c.post('/charges', { amount: 1 }));
      expect(error.code).toBe('deadline_exceeded');
      expect(error.attempts).toHaveLength(1);
      expect(error.attempts[0]?.outcome).toBe('timeout');
    } finally {
      silent.closeAllConnections();
      silent.close();
    }
  });

  it('a server-minted key is reused on the retries: one charge', async () => {
    let release: () => void = () => undefined;
    const hold = new Promise<void>((resolve) => {
      release = resolve;
    });
    const s = await server({ mintKeys: true, answerMintedWith504: true, holdFirstExecution: hold });
    const time = fakeTime();
    let sleeps = 0;
    time.onSleep(async () => {
      if (++sleeps === 2) {
        release();
        await s.settled();
      }
    });
    const result = await client(s.url, time).post('/charges', { amount: 9 }, { idempotencyKey: false });
    const minted = s.log[0]?.key;
    expect(minted).toMatch(/^[0-9a-f-]{36}$/);
    expect(result.attempts.map((a) => [a.status, a.key])).toEqual([
      [504, undefined],
      [409, minted],
      [201, minted],
    ]);
    expect(s.log.map((r) => r.key)).toEqual([minted, minted, minted]);
    expect(result.key).toBe(minted);
    expect(result.replayed).toBe(true);
    expect(s.charges).toHaveLength(1);
  });

  it('a refreshed token is used on the retry, and the caller stays the same', async () => {
    const s = await server({ dropResponses: 1 });
    const time = fakeTime();
    let n = 0;
    const c = createClient({
      baseUrl: s.url,
      sleep: time.sleep,
      now: time.now,
      random: seededRandom(1),
      getToken: async () => `user-42.token-${++n}`,
    });
    const result = await c.post('/charges', { amount: 5 });
    expect(s.log.map((r) => r.authorization)).toEqual(['Bearer user-42.token-1', 'Bearer user-42.token-2']);
    expect(result.replayed).toBe(true);
    expect(s.charges).toHaveLength(1);
  });

  it('without the client (a new key per attempt) the same fault charges twice: the test can fail', async () => {
    const s = await server({ dropResponses: 1 });
    const c = client(s.url, fakeTime(), { maxAttempts: 1 });
    await failure(c.post('/charges', { amount: 1 }));
    await c.post('/charges', { amount: 1 });
    expect(s.charges).toHaveLength(2);
  });
});
