import { describe, expect, it, vi } from 'vitest';
import {
  type AttemptRecord,
  createSender,
  createVerifier,
  parseRetryAfter,
  type SenderOptions,
  seededRandom,
} from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const START = Date.UTC(2026, 0, 1);

type Reply = { status: number; headers?: Record<string, string>; body?: string } | 'network-error' | 'hang';

/** A scripted endpoint and an injected clock whose sleep advances time instead of waiting. */
function harness(replies: Reply[] | ((call: number) => Reply), options: Partial<SenderOptions> = {}) {
  let t = START;
  const calls: { url: string; init: RequestInit; at: number }[] = [];
  const sleeps: number[] = [];
  const fetch = (async (url: string | URL, init: RequestInit = {}) => {
    calls.push({ url: String(url), init, at: t });
    const reply =
      typeof replies === 'function' ? replies(calls.length) : (replies[calls.length - 1] ?? replies.at(-1)!);
    if (reply === 'network-error') throw new TypeError('fetch failed', { cause: { code: 'ECONNRESET' } });
    if (reply === 'hang') {
      return new Promise((_, reject) => init.signal?.addEventListener('abort', () => reject(init.signal?.reason)));
    }
    return new Response(reply.body ?? null, { status: reply.status, headers: reply.headers ?? {} });
  }) as typeof globalThis.fetch;
  const sender = createSender({
    secret: SECRET,
    fetch,
    now: () => t,
    sleep: async (ms) => {
      sleeps.push(ms);
      t += ms;
    },
    random: seededRandom(7),
    ...options,
  });
  return { sender, calls, sleeps, now: () => t, advance: (ms: number) => (t += ms) };
}

const message = { url: 'https://receiver.test/hooks', id: 'evt_1', body: '{"type":"payment.succeeded"}' };
const header = (init: RequestInit, name: string) => (init.headers as Record<string, string>)[name];

describe('retry schedule with a seeded random source', () => {
  it('keeps every wait inside [0, min(cap, base * 2^(n-1))), under the cap, and waits exactly that long', async () => {
    const { sender, calls, sleeps } = harness([{ status: 500 }], {
      schedule: { base: '1s', cap: '30s', maxAttempts: 14, horizon: '7d' },
    });
    const result = await sender.send(message);
    expect(result.outcome).toBe('dead-letter');
    if (result.outcome !== 'dead-letter') return;
    expect(result.reason).toBe('max-attempts');
    expect(result.attempts).toHaveLength(14);
    expect(sleeps).toHaveLength(13);
    sleeps.forEach((wait, index) => {
      const ceiling = Math.min(30_000, 1000 * 2 ** index);
      expect(wait).toBeGreaterThanOrEqual(0);
      expect(wait).toBeLessThan(ceiling);
      expect(result.attempts[index]?.waitMs).toBe(wait);
      // The next attempt starts exactly when the wait ends: the schedule is what runs.
      expect((calls[index + 1]?.at ?? 0) - (calls[index]?.at ?? 0)).toBe(wait);
    });
    // Past the cap the draws still spread over the whole capped interval.
    expect(Math.max(...sleeps.slice(6))).toBeGreaterThan(15_000);
  });

  it('is reproducible: the same seed gives the same waits', async () => {
    const a = harness([{ status: 500 }], { schedule: { maxAttempts: 6 }, random: seededRandom(99) });
    const b = harness([{ status: 500 }], { schedule: { maxAttempts: 6 }, random: seededRandom(99) });
    await a.sender.send(message);
    await b.sender.send(message);
    expect(a.sleeps).toEqual(b.sleeps);
  });

  it('lets Retry-After win when larger, keeps the jitter when larger, and cuts it to maxRetryAfter', async () => {
    const larger = harness([{ status: 503, headers: { 'retry-after': '120' } }, { status: 200 }]);
    expect((await larger.sender.send(message)).outcome).toBe('delivered');
    expect(larger.sleeps).toEqual([120_000]);

    const smaller = harness([{ status: 429, headers: { 'retry-after': '0' } }, { status: 500 }, { status: 204 }], {
      random: () => 0.5,
    });
    await smaller.sender.send(message);
    expect(smaller.sleeps).toEqual([500, 1000]);

    const huge = harness([{ status: 503, headers: { 'retry-after': '999999' } }, { status: 200 }], {
      schedule: { cap: '10m', maxRetryAfter: '15m' },
    });
    await huge.sender.send(message);
    expect(huge.sleeps).toEqual([900_000]);

    const dated = harness([
      { status: 503, headers: { 'retry-after': new Date(START + 90_000).toUTCString() } },
      { status: 200 },
    ]);
    await dated.sender.send(message);
    expect(dated.sleeps).toEqual([90_000]);
  });

  it('cuts a Retry-After of any length to maxRetryAfter, never drops it for the jitter draw', async () => {
    for (const value of ['9999999999', '99999999999', '9'.repeat(400)]) {
      const { sender, sleeps } = harness([{ status: 503, headers: { 'retry-after': value } }, { status: 200 }], {
        random: () => 0.5,
      });
      expect((await sender.send(message)).outcome).toBe('delivered');
      expect(sleeps).toEqual([3_600_000]); // the default cap, which is the default maxRetryAfter
    }
  });

  it('honours every HTTP-date form of Retry-After, the obsolete asctime one included (RFC 9110 5.6.7)', async () => {
    // START is Thu, 01 Jan 2026 00:00:00 GMT.
    for (const value of [
      'Thu, 01 Jan 2026 00:01:30 GMT',
      'Thursday, 01-Jan-26 00:01:30 GMT',
      'Thu Jan  1 00:01:30 2026',
    ]) {
      const { sender, sleeps } = harness([{ status: 503, headers: { 'retry-after': value } }, { status: 200 }], {
        random: () => 0,
      });
      await sender.send(message);
      expect(sleeps).toEqual([90_000]);
    }
  });

  it('stops at once on 410 Gone, with no wait and no further attempt', async () => {
    const { sender, calls, sleeps } = harness([{ status: 410, body: 'endpoint disabled' }]);
    const result = await sender.send(message);
    expect(result).toMatchObject({
      outcome: 'dead-letter',
      reason: 'gone',
      lastAttempt: { status: 410, result: 'gone', responseBody: 'endpoint disabled' },
    });
    expect(calls).toHaveLength(1);
    expect(sleeps).toHaveLength(0);
  });
});

describe('attempts', () => {
  it('counts any 2xx as delivered, whatever the body', async () => {
    for (const status of [200, 201, 202, 204, 299]) {
      const { sender } = harness([{ status, body: status === 204 ? undefined : 'not json at all' } as Reply]);
      expect((await sender.send(message)).outcome).toBe('delivered');
    }
  });

  it('re-signs every attempt: same id, new timestamp and signature; the first attempt replayed later fails (case 29)', async () => {
    const { sender, calls } = harness([{ status: 500 }, { status: 200 }], {
      random: () => 0.999,
      schedule: { base: '10m', cap: '1h' },
    });
    const result = await sender.send(message);
    expect(result.outcome).toBe('delivered');
    const [first, second] = calls.map((call) => call.init);
    expect(header(first!, 'webhook-id')).toBe('evt_1');
    expect(header(second!, 'webhook-id')).toBe('evt_1');
    expect(
      Number(header(second!, 'webhook-timestamp')) - Number(header(first!, 'webhook-timestamp')),
    ).toBeGreaterThanOrEqual(599);
    expect(header(second!, 'webhook-signature')).not.toBe(header(first!, 'webhook-signature'));
    const atSecond = createVerifier({ secret: SECRET, now: () => calls[1]!.at });
    const body = Buffer.from(message.body);
    expect(atSecond.verify({ headers: second!.headers as Record<string, string>, body }).ok).toBe(true);
    const replayed = atSecond.verify({ headers: first!.headers as Record<string, string>, body });
    expect(replayed.ok ? 'ok' : replayed.error.code).toBe('timestamp_too_old');
  });

  it("attempt({ now }) signs, dates and reads Retry-After by that clock instead of the sender's", async () => {
    const other = START + 3_600_000;
    const { sender, calls } = harness([
      { status: 503, headers: { 'retry-after': new Date(other + 9_000).toUTCString() } },
    ]);
    const record = await sender.attempt(message, 1, { now: () => other });
    expect(Number(header(calls[0]!.init, 'webhook-timestamp'))).toBe(other / 1000);
    expect(record.startedAt).toBe(other);
    expect(record.retryAfterMs).toBe(9_000);
    const byOther = createVerifier({ secret: SECRET, now: () => other });
    const body = Buffer.from(message.body);
    expect(byOther.verify({ headers: calls[0]!.init.headers as Record<string, string>, body }).ok).toBe(true);
    // Without it, the sender's own clock.
    await sender.attempt(message, 2);
    expect(Number(header(calls[1]!.init, 'webhook-timestamp'))).toBe(START / 1000);
    await expect(sender.attempt(message, 3, { now: 5 as never })).rejects.toThrow(TypeError);
  });

  it('retries every other 4xx and 5xx, 404 included: only 410 stops', async () => {
    for (const status of [400, 401, 403, 404, 409, 422, 429, 500, 503]) {
      const { sender, calls } = harness([{ status }, { status: 200 }]);
      const result = await sender.send(message);
      expect(result.outcome, String(status)).toBe('delivered');
      expect(
        result.attempts.map((a) => a.result),
        String(status),
      ).toEqual(['failed', 'delivered']);
      expect(calls, String(status)).toHaveLength(2);
    }
  });

  it('treats 3xx as a failure and never follows the redirect', async () => {
    const { sender, calls } = harness([
      { status: 302, headers: { location: 'https://elsewhere.test/' } },
      { status: 200 },
    ]);
    const result = await sender.send(message);
    expect(result.attempts.map((a) => [a.result, a.status])).toEqual([
      ['failed', 302],
      ['delivered', 200],
    ]);
    expect(calls.every((call) => call.init.redirect === 'manual' && call.url === message.url)).toBe(true);
  });

  it('times an attempt out and retries; network errors are retried too', async () => {
    const { sender } = harness(['hang', 'network-error', { status: 200 }], { timeout: 30 });
    const result = await sender.send(message);
    expect(result.outcome).toBe('delivered');
    expect(result.attempts.map((a) => a.result)).toEqual(['timeout', 'network-error', 'delivered']);
    expect(result.attempts[1]?.error).toBe('ECONNRESET');
  });

  it('sends the body bytes exactly, with the content type and extra headers', async () => {
    const { sender, calls } = harness([{ status: 200 }], { headers: { 'user-agent': 'idem-test' } });
    const body = Buffer.from([0x7b, 0xff, 0x7d]);
    await sender.send({ ...message, body, contentType: 'application/octet-stream', headers: { 'x-tenant': 't1' } });
    const init = calls[0]!.init;
    expect(Buffer.from(init.body as Uint8Array)).toEqual(body);
    expect(header(init, 'content-type')).toBe('application/octet-stream');
    expect(header(init, 'user-agent')).toBe('idem-test');
    expect(header(init, 'x-tenant')).toBe('t1');
  });

  it('merges header names case-insensitively: a caller cannot add a second content-type or webhook-* value', async () => {
    // fetch appends names that differ only in case, so `Content-Type` beside our `content-type` would
    // go out as one combined value, and a stray `Webhook-Signature` would break every delivery.
    // send() and add() refuse those names now; attempt() is the relay's path, which still sends the
    // outbox rows an earlier version stored with them.
    const { sender, calls } = harness([{ status: 200 }], { headers: { 'User-Agent': 'base', 'X-Tenant': 'base' } });
    const body = '{"ok":true}';
    await sender.attempt(
      {
        ...message,
        body,
        contentType: 'application/cloudevents+json',
        headers: {
          'Content-Type': 'text/plain',
          'Webhook-Signature': 'v1,AAAA',
          'WEBHOOK-ID': 'other',
          'x-tenant': 't1',
        },
      },
      1,
    );
    const sent = new Headers(calls[0]!.init.headers);
    expect(sent.get('content-type')).toBe('application/cloudevents+json');
    expect(sent.get('webhook-id')).toBe(message.id);
    expect(sent.get('user-agent')).toBe('base');
    expect(sent.get('x-tenant')).toBe('t1');
    const verified = createVerifier({ secret: SECRET, now: () => START }).verify({ headers: sent, body });
    expect(verified.ok).toBe(true);
  });

  it('throws for a message no attempt could send, instead of retrying it until the horizon', async () => {
    const { sender, calls } = harness([{ status: 200 }]);
    const cases: { url?: string; id?: string; contentType?: string; headers?: Record<string, string> }[] = [
      { url: 'mailto:ops@example.com' },
      { url: 'not a url' },
      { id: 'a.b' },
      { contentType: 7 as unknown as string },
      { headers: { 'bad name': 'x' } },
      { headers: { 'x-ok': 'line\nbreak' } },
      { headers: { 'x-number': 7 as unknown as string } },
    ];
    for (const bad of cases) {
      await expect(sender.send({ ...message, ...bad }), JSON.stringify(bad)).rejects.toThrow(TypeError);
      // Refused before the loop, not by the signer inside the first attempt: a signal aborted
      // already does not turn a message that could never be sent into an 'aborted' dead letter.
      await expect(
        sender.send({ ...message, ...bad }, { signal: AbortSignal.abort() }),
        JSON.stringify(bad),
      ).rejects.toThrow(TypeError);
    }
    expect(calls).toHaveLength(0);
    // A URL object is a URL.
    expect((await sender.send({ ...message, url: new URL(String(message.url)) })).outcome).toBe('delivered');
  });
});

describe('giving up', () => {
  it('dead-letters at the horizon: no attempt starts after it', async () => {
    const { sender, calls } = harness([{ status: 500 }], {
      schedule: { base: '1s', cap: '4s', horizon: '30s' },
      random: () => 0.99,
    });
    const result = await sender.send(message);
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'horizon' });
    expect(calls.at(-1)!.at - START).toBeLessThanOrEqual(30_000);
    expect(calls.length).toBeGreaterThan(5);
  });

  it('keeps the whole attempt history and the last response in the dead letter (case 31)', async () => {
    const { sender } = harness([{ status: 500, body: 'boom' }, 'network-error', { status: 502, body: 'bad gateway' }], {
      schedule: { maxAttempts: 3 },
    });
    const result = await sender.send(message);
    if (result.outcome !== 'dead-letter') throw new Error('expected a dead letter');
    expect(result.reason).toBe('max-attempts');
    expect(result.attempts.map((a: AttemptRecord) => a.attempt)).toEqual([1, 2, 3]);
    expect(result.attempts[0]).toMatchObject({ status: 500, responseBody: 'boom' });
    expect(result.lastAttempt).toMatchObject({ status: 502, responseBody: 'bad gateway', result: 'failed' });
  });

  it('keeps only the first KiB of a long response body', async () => {
    const { sender } = harness([{ status: 500, body: 'x'.repeat(5000) }], { schedule: { maxAttempts: 1 } });
    const result = await sender.send(message);
    expect(result.attempts[0]?.responseBody).toBe('x'.repeat(1024));
  });

  it('stops when the caller aborts', async () => {
    const controller = new AbortController();
    const { sender } = harness(() => {
      controller.abort();
      return { status: 500 };
    });
    const result = await sender.send(message, { signal: controller.signal });
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'aborted' });
    expect(result.attempts).toHaveLength(1);
  });

  it('aborts the attempt in flight when the caller aborts, instead of waiting for its timeout', async () => {
    const controller = new AbortController();
    const { sender } = harness(
      () => {
        setTimeout(() => controller.abort(), 10);
        return 'hang';
      },
      { timeout: '10s' },
    );
    const started = performance.now();
    const result = await sender.send(message, { signal: controller.signal });
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'aborted' });
    expect(result.attempts[0]).toMatchObject({ result: 'network-error', error: 'aborted by the caller' });
    expect(performance.now() - started).toBeLessThan(5_000);
  });

  it('reports an abort during the last attempt as aborted, not max-attempts, and waits no more', async () => {
    const controller = new AbortController();
    const { sender, sleeps } = harness(
      () => {
        controller.abort();
        return { status: 500 };
      },
      { schedule: { maxAttempts: 1 } },
    );
    const result = await sender.send(message, { signal: controller.signal });
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'aborted' });
    expect(result.attempts).toHaveLength(1);
    expect(sleeps).toHaveLength(0);
  });

  it('reports each attempt to onAttempt and survives an observer that throws', async () => {
    const seen: number[] = [];
    const { sender } = harness([{ status: 500 }, { status: 200 }], {
      onAttempt: (attempt) => {
        seen.push(attempt.attempt);
        throw new Error('observer bug');
      },
    });
    expect((await sender.send(message)).outcome).toBe('delivered');
    expect(seen).toEqual([1, 2]);
  });

  it('handles what an async onAttempt rejects with (unhandled, it would end the process)', async () => {
    // Pending, and recording whether a handler was attached: a rejecting promise would fail the file.
    const returned = new Promise<void>(() => undefined);
    const handlers = vi.spyOn(returned, 'then');
    const { sender } = harness([{ status: 200 }], { onAttempt: () => returned });
    expect((await sender.send(message)).outcome).toBe('delivered');
    expect(handlers).toHaveBeenCalled();
  });
});

describe('options and helpers', () => {
  it('refuses bad schedules at construction', () => {
    expect(() => createSender({ secret: SECRET, schedule: { base: 0 } })).toThrow(TypeError);
    expect(() => createSender({ secret: SECRET, schedule: { base: '1m', cap: '1s' } })).toThrow(TypeError);
    expect(() => createSender({ secret: SECRET, schedule: { maxAttempts: 0 } })).toThrow(TypeError);
    // The per-attempt timer is one timer, which fires at once past 2^31 - 1 ms (about 24.9 days):
    // every attempt would time out at once.
    expect(() => createSender({ secret: SECRET, timeout: '30d' })).toThrow(
      'timeout must be at most 2147483647 ms (about 24.9 days)',
    );
    // Headers every message would carry, refused once rather than failing every attempt.
    expect(() => createSender({ secret: SECRET, headers: { 'bad name': 'x' } })).toThrow(TypeError);
    // The waits between attempts are not: the default sleep takes a long one in steps.
    expect(createSender({ secret: SECRET, schedule: { cap: '26d' } }).schedule.capMs).toBe(26 * 86_400_000);
    expect(createSender({ secret: SECRET, schedule: { maxRetryAfter: '30d' } }).schedule.maxRetryAfterMs).toBe(
      30 * 86_400_000,
    );
    expect(createSender({ secret: SECRET }).schedule).toMatchObject({
      baseMs: 1000,
      capMs: 3_600_000,
      horizonMs: 86_400_000,
      timeoutMs: 15_000,
    });
  });

  it('the default sleep waits a cap or a Retry-After longer than one timer holds in full, in steps', async () => {
    const day = 86_400_000;
    vi.useFakeTimers({ now: START });
    try {
      // A 26-day cap: the first retry waits 0.99 of it. One timer would fire after 1 ms.
      const calls: number[] = [];
      const capped = createSender({
        secret: SECRET,
        schedule: { base: '26d', cap: '26d', horizon: '60d' },
        random: () => 0.99,
        fetch: (async () => {
          calls.push(Date.now());
          return new Response(null, { status: calls.length === 1 ? 500 : 200 });
        }) as typeof fetch,
      });
      const first = capped.send(message);
      await vi.advanceTimersByTimeAsync(25 * day);
      expect(calls).toHaveLength(1);
      await vi.advanceTimersByTimeAsync(day);
      const result = await first;
      expect(result.outcome).toBe('delivered');
      expect(result.attempts[0]!.waitMs).toBeGreaterThan(2 ** 31);
      expect(calls[1]! - calls[0]!).toBe(result.attempts[0]!.waitMs);

      // A Retry-After of 35 days under a 40-day maxRetryAfter.
      const asked: number[] = [];
      const slowedDown = createSender({
        secret: SECRET,
        schedule: { maxRetryAfter: '40d', horizon: '60d' },
        fetch: (async () => {
          asked.push(Date.now());
          return new Response(null, { status: 503, headers: { 'retry-after': String(35 * 86_400) } });
        }) as typeof fetch,
      });
      const second = slowedDown.send(message);
      await vi.advanceTimersByTimeAsync(34 * day);
      expect(asked).toHaveLength(1);
      await vi.advanceTimersByTimeAsync(day);
      // The next 35-day wait would pass the 60-day horizon: it stops there.
      expect(await second).toMatchObject({ outcome: 'dead-letter', reason: 'horizon' });
      expect(asked[1]! - asked[0]!).toBe(35 * day);

      // An abort ends a long wait in any of its steps, and leaves no timer behind.
      const controller = new AbortController();
      const third = slowedDown.send(message, { signal: controller.signal });
      await vi.advanceTimersByTimeAsync(30 * day);
      controller.abort();
      expect(await third).toMatchObject({ outcome: 'dead-letter', reason: 'aborted' });
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it('parses Retry-After strictly', () => {
    expect(parseRetryAfter('120', 0)).toBe(120_000);
    expect(parseRetryAfter(' 5 ', 0)).toBe(5000);
    expect(parseRetryAfter('1.5', 0)).toBeUndefined();
    expect(parseRetryAfter('-1', 0)).toBeUndefined();
    expect(parseRetryAfter('soon', 0)).toBeUndefined();
    expect(parseRetryAfter(new Date(1_000_000).toUTCString(), 2_000_000)).toBe(0);
    expect(parseRetryAfter(null, 0)).toBeUndefined();
    // A zone other than GMT is not an HTTP-date; asctime has none and is GMT.
    expect(parseRetryAfter('Thu, 01 Jan 1970 00:00:05 PST', 0)).toBeUndefined();
    expect(parseRetryAfter('Thu Jan  1 00:00:05 1970', 0)).toBe(5000);
    expect(parseRetryAfter('99999999999', 0)).toBe(99_999_999_999_000);
  });
});
