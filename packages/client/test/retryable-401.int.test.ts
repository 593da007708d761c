// @idem/guard fails closed with a 401 whose problem says `"retryable": true` when the fault is its
// own dependency, not the token: the issuer's keys cannot be fetched (`keys_unavailable`), the DPoP
// replay memory is full or down (`dpop_replay_full`, `dpop_replay_share_full`,
// `dpop_replay_unavailable`). The same token may pass later, so the client retries such a 401 as it
// retries a 503: with backoff, within maxAttempts and the deadline, and only where a repeat is
// harmless (a safe or idempotent method, or a write with a key), never an unkeyed POST. The answers
// below are the guard's (packages/guard/src/errors.ts: GuardError's wwwAuthenticate and toProblem).
import type { ServerResponse } from 'node:http';
import type { RetryOptions } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { clientWithTokens, type GuardRefusal as Refusal, refuseAsGuard as refuse } from './support/guard-401.js';
import { closeServers, serve } from './support/logging-server.js';

afterEach(closeServers);

const keysUnavailable: Refusal = {
  code: 'keys_unavailable',
  title: 'Signing keys unavailable',
  error: 'invalid_token',
  description: 'The signing keys of the issuer could not be retrieved',
  retryable: true,
};
const replayUnavailable: Refusal = {
  code: 'dpop_replay_unavailable',
  title: 'DPoP replay memory unavailable',
  error: 'invalid_dpop_proof',
  description: 'The DPoP proof cannot be accepted now: the replay memory is unavailable',
  retryable: true,
};
const replayFull: Refusal = {
  code: 'dpop_replay_full',
  title: 'DPoP replay memory full',
  error: 'invalid_dpop_proof',
  description: 'The DPoP proof cannot be accepted now: the replay memory is full',
  retryable: true,
};
const tokenExpired: Refusal = {
  code: 'token_expired',
  title: 'Token expired',
  error: 'invalid_token',
  description: 'The access token expired',
  retryable: false,
};

const ok = (res: ServerResponse, status = 200) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end('{"ok":true}');

/** A client on fake time (waits recorded, none real), 1 s backoff without jitter unless `retry` says otherwise. */
const clientFor = (url: string, retry: RetryOptions = {}) =>
  clientWithTokens(url, { baseDelay: '1s', jitter: 'none', ...retry });

describe('a 401 that says "retryable": true', () => {
  it('Was wrong: a GET refused keys_unavailable was final; it is retried with backoff and the same token, no refresh', async () => {
    const s = await serve((_req, res, n) => (n <= 2 ? refuse(res, keysUnavailable) : ok(res)));
    const { client, time, asked } = clientFor(s.url);
    const result = await client.get('/orders');
    expect(result.status).toBe(200);
    expect(result.attempts.map((attempt) => attempt.status)).toEqual([401, 401, 200]);
    expect(time.waits).toEqual([1000, 2000]);
    // The token was fine: the guard could not check it. None is asked for afresh.
    expect(asked.every((context) => !context.refresh)).toBe(true);
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual([
      'Bearer token-0',
      'Bearer token-0',
      'Bearer token-0',
    ]);
  });

  it('Was wrong: a keyed POST refused dpop_replay_unavailable was final; it is retried with its key', async () => {
    const s = await serve((_req, res, n) => (n === 1 ? refuse(res, replayUnavailable) : ok(res, 201)));
    const { client } = clientFor(s.url);
    const result = await client.post('/charges', { amount: 500 });
    expect(result.status).toBe(201);
    expect(result.attempts).toHaveLength(2);
    const keys = s.log.map((seen) => seen.headers['idempotency-key']);
    expect(keys[0]).toEqual(expect.any(String));
    expect(keys[1]).toBe(keys[0]);
  });

  it('Was wrong: a PUT (idempotent, no key) refused dpop_replay_full is retried', async () => {
    const s = await serve((_req, res, n) => (n === 1 ? refuse(res, replayFull) : ok(res)));
    const { client } = clientFor(s.url);
    const result = await client.put('/settings', { theme: 'dark' });
    expect(result.status).toBe(200);
    expect(s.log).toHaveLength(2);
  });

  it('an unkeyed POST is not retried for it: a "retryable" 401 is not trusted to mean that nothing ran', async () => {
    const s = await serve((_req, res) => refuse(res, replayFull));
    const { client, time } = clientFor(s.url);
    const error = await failure(client.post('/notes', { text: 'hi' }, { idempotencyKey: false }));
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(401);
    expect(s.log).toHaveLength(1);
    expect(time.waits).toEqual([]);
  });

  it('stops at maxAttempts', async () => {
    const s = await serve((_req, res) => refuse(res, keysUnavailable));
    const { client } = clientFor(s.url, { maxAttempts: 3 });
    const error = await failure(client.get('/orders'));
    expect(error.code).toBe('attempts_exhausted');
    expect(error.status).toBe(401);
    expect(s.log).toHaveLength(3);
  });

  it('stops at the deadline', async () => {
    const s = await serve((_req, res) => refuse(res, keysUnavailable));
    const { client, time } = clientFor(s.url, { maxAttempts: 10, deadline: '5s' });
    const error = await failure(client.get('/orders'));
    expect(error.code).toBe('deadline_exceeded');
    // 1 s, then 2 s; the next wait (4 s) would end past the deadline.
    expect(time.waits).toEqual([1000, 2000]);
    expect(s.log).toHaveLength(3);
  });

  it('"retryable": false, or none, on a 401 is final as before', async () => {
    const s = await serve((_req, res) =>
      res.writeHead(401, { 'content-type': 'application/problem+json' }).end('{"code":"token_missing"}'),
    );
    const { client } = clientFor(s.url);
    const error = await failure(client.get('/orders'));
    expect(error.code).toBe('http_error');
    expect(s.log).toHaveLength(1);
  });
});

describe('the invalid_token refresh, next to it', () => {
  it('is kept for the token: keys_unavailable spends no refresh, and a later token_expired still gets its one', async () => {
    const s = await serve((req, res, n) => {
      if (n === 1) return refuse(res, keysUnavailable);
      if (req.headers.authorization === 'Bearer token-0') return refuse(res, tokenExpired);
      return ok(res);
    });
    const { client, asked } = clientFor(s.url);
    const result = await client.get('/orders');
    expect(result.status).toBe(200);
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual([
      'Bearer token-0',
      'Bearer token-0',
      'Bearer token-1',
    ]);
    expect(asked.filter((context) => context.refresh)).toHaveLength(1);
  });

  it('still refreshes once for an unkeyed POST refused invalid_token, retryable or not (a 401 was not let in)', async () => {
    const s = await serve((_req, res) => refuse(res, keysUnavailable));
    const { client, asked, time } = clientFor(s.url);
    const error = await failure(client.post('/notes', { text: 'hi' }, { idempotencyKey: false }));
    expect(error.code).toBe('http_error');
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual(['Bearer token-0', 'Bearer token-1']);
    expect(asked.filter((context) => context.refresh)).toHaveLength(1);
    expect(time.waits).toEqual([0]);
  });
});
