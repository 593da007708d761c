import { backoffCeiling, createClient, isRequestFailedError } from '@idem/client';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { empty, type Step, scriptedFetch } from './support/fake-fetch.js';
import { fakeTime, seededRandom } from './support/fake-time.js';

// One scripted server answer: a status (with an optional Retry-After in seconds) or a network error.
const answer = fc.oneof(
  fc.record({ kind: fc.constant('network' as const) }),
  fc.record({
    kind: fc.constant('status' as const),
    status: fc.constantFrom(201, 200, 409, 429, 500, 502, 503, 504, 400, 422),
    retryAfter: fc.option(fc.integer({ min: 0, max: 20 }), { nil: undefined }),
  }),
);

const retryable = new Set([409, 429, 500, 502, 503, 504]);

describe('client properties (fake fetch, fake time)', () => {
  it('one key on every attempt, waits inside their bounds, limits respected, stops at the first final answer', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(answer, { minLength: 1, maxLength: 12 }),
        fc.integer({ min: 1, max: 10 }),
        fc.integer({ min: 1_000, max: 120_000 }),
        fc.integer(),
        async (script, maxAttempts, deadline, seed) => {
          const steps: Step[] = script.map((a) =>
            a.kind === 'network'
              ? new TypeError('fetch failed')
              : empty(a.status, a.retryAfter === undefined ? {} : { 'retry-after': String(a.retryAfter) }),
          );
          const time = fakeTime();
          const { fetch, seen } = scriptedFetch(steps);
          const client = createClient({
            baseUrl: 'https://api.example.test',
            fetch,
            random: seededRandom(seed),
            sleep: time.sleep,
            now: time.now,
            retry: { maxAttempts, deadline, maxRetryAfter: '30s' },
          });
          const outcome = await client.post('/charges', { amount: 1 }).then(
            (result) => ({ ok: true as const, result }),
            (error: unknown) => ({ ok: false as const, error }),
          );

          // Every attempt carried the one key of the operation.
          expect(seen.length).toBeGreaterThanOrEqual(1);
          expect(new Set(seen.map((r) => r.headers.get('idempotency-key'))).size).toBe(1);
          // Limits.
          expect(seen.length).toBeLessThanOrEqual(maxAttempts);
          expect(time.waits).toHaveLength(seen.length - 1);
          expect(time.waits.reduce((a, b) => a + b, 0)).toBeLessThan(deadline);
          // Each wait: at least the Retry-After asked for, at most the larger of the backoff ceiling and
          // it with its spread (a fifth of it, at most the 1 s base delay).
          time.waits.forEach((wait, i) => {
            const asked = script[Math.min(i, script.length - 1)];
            const retryAfterMs =
              asked?.kind === 'status' && asked.retryAfter !== undefined ? asked.retryAfter * 1000 : 0;
            expect(wait).toBeGreaterThanOrEqual(retryAfterMs);
            const spread = Math.min(1000, retryAfterMs / 5);
            expect(wait).toBeLessThanOrEqual(Math.max(retryAfterMs + spread, backoffCeiling(i + 1, 1000, 30_000)));
          });
          // Every answer before the last one was retryable.
          for (let i = 0; i < seen.length - 1; i++) {
            const a = script[Math.min(i, script.length - 1)];
            expect(a?.kind === 'network' || (a?.kind === 'status' && retryable.has(a.status))).toBe(true);
          }
          const last = script[Math.min(seen.length - 1, script.length - 1)];
          if (outcome.ok) {
            expect(last?.kind === 'status' && last.status < 400).toBe(true);
            expect(outcome.result.attempts).toHaveLength(seen.length);
          } else {
            expect(isRequestFailedError(outcome.error)).toBe(true);
            if (isRequestFailedError(outcome.error)) {
              expect(outcome.error.attempts).toHaveLength(seen.length);
              if (last?.kind === 'status' && !retryable.has(last.status)) expect(outcome.error.code).toBe('http_error');
              else expect(['attempts_exhausted', 'deadline_exceeded']).toContain(outcome.error.code);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
