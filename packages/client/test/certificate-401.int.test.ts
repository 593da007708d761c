// @idem/guard refuses a certificate-bound token (RFC 8705) with a 401 `invalid_token`, as RFC 8705 §3
// asks, and says which way in its problem's `code`: `certificate_missing` (the request came with no
// client certificate) or `certificate_mismatch` (with another one than the token is bound to). The
// challenge alone would make the client ask getToken for a fresh token and send again. A fresh token
// does not give a request the certificate it lacks: the 401 must be final at once, without asking
// the token endpoint for nothing. A mismatch is different: after the client's certificate was
// rotated, its cached token is still bound to the old one, and a token asked for afresh (over the
// new certificate) is bound to the new one, so the one refresh of the call stays. The answers below
// are the guard's (packages/guard/src/errors.ts: GuardError's wwwAuthenticate and toProblem).
import type { ServerResponse } from 'node:http';
import { createClient, type TokenContext } from '@idem/client';
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { fakeTime } from './support/fake-time.js';
import { closeServers, serve } from './support/logging-server.js';

afterEach(closeServers);

const refusals = {
  certificate_missing: {
    title: 'Client certificate required',
    description: 'The access token is bound to a client certificate and none was presented',
  },
  certificate_mismatch: {
    title: 'Wrong client certificate',
    description: 'The access token is bound to another client certificate',
  },
} as const;

/** Answers as the guard's glue does: 401, its Bearer challenge, its problem. */
function refuse(res: ServerResponse, code: keyof typeof refusals) {
  const { title, description } = refusals[code];
  res
    .writeHead(401, {
      'content-type': 'application/problem+json',
      'www-authenticate': `Bearer realm="api", error="invalid_token", error_description="${description}"`,
    })
    .end(
      JSON.stringify({
        type: `https://idem.dev/problems/${code.replaceAll('_', '-')}`,
        title,
        status: 401,
        detail: description,
        code,
        retryable: false,
      }),
    );
}

/** A client on fake time, and a getToken that records what it was asked and gives a new token on refresh. */
function clientFor(url: string) {
  const time = fakeTime();
  const asked: TokenContext[] = [];
  let issued = 0;
  const client = createClient({
    baseUrl: url,
    sleep: time.sleep,
    now: time.now,
    random: () => 0.5,
    getToken: (context) => {
      asked.push(context);
      if (context.refresh) issued++;
      return `token-${issued}`;
    },
  });
  return { client, asked };
}

describe('a 401 certificate_missing (a certificate-bound token sent without a client certificate)', () => {
  it('Was wrong: it asked getToken for a fresh token and sent again; it is final on the first answer', async () => {
    const s = await serve((_req, res) => refuse(res, 'certificate_missing'));
    const { client, asked } = clientFor(s.url);
    const error = await failure(client.post('/charges', { amount: 500 }));
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(401);
    expect(error.body).toMatchObject({ code: 'certificate_missing' });
    expect(s.log).toHaveLength(1);
    expect(asked).toEqual([{ refresh: false }]);
  });

  it('a GET too: no refresh, one request', async () => {
    const s = await serve((_req, res) => refuse(res, 'certificate_missing'));
    const { client, asked } = clientFor(s.url);
    const error = await failure(client.get('/orders'));
    expect(error.status).toBe(401);
    expect(s.log).toHaveLength(1);
    expect(asked.some((context) => context.refresh)).toBe(false);
  });
});

describe('a 401 certificate_mismatch (a token bound to another certificate)', () => {
  it('is sent again once with a refreshed token: after a certificate rotation, the new token is bound to the new one', async () => {
    const s = await serve((_req, res, n) => (n === 1 ? refuse(res, 'certificate_mismatch') : res.writeHead(201).end()));
    const { client, asked } = clientFor(s.url);
    const result = await client.post('/charges', { amount: 500 });
    expect(result.status).toBe(201);
    expect(asked).toEqual([{ refresh: false }, { refresh: true }]);
    expect(s.log.map((seen) => seen.headers.authorization)).toEqual(['Bearer token-0', 'Bearer token-1']);
    // One operation: the same key on both.
    expect(s.log[1]?.headers['idempotency-key']).toBe(s.log[0]?.headers['idempotency-key']);
  });

  it('refused again, it is final: one refresh per call', async () => {
    const s = await serve((_req, res) => refuse(res, 'certificate_mismatch'));
    const { client } = clientFor(s.url);
    const error = await failure(client.get('/orders'));
    expect(error.code).toBe('http_error');
    expect(error.body).toMatchObject({ code: 'certificate_mismatch' });
    expect(s.log).toHaveLength(2);
  });
});
