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
import { afterEach, describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { clientWithTokens, type GuardRefusal, refuseAsGuard } from './support/guard-401.js';
import { closeServers, serve } from './support/logging-server.js';

afterEach(closeServers);

const refusals: Record<'certificate_missing' | 'certificate_mismatch', GuardRefusal> = {
  certificate_missing: {
    code: 'certificate_missing',
    title: 'Client certificate required',
    error: 'invalid_token',
    description: 'The access token is bound to a client certificate and none was presented',
    retryable: false,
  },
  certificate_mismatch: {
    code: 'certificate_mismatch',
    title: 'Wrong client certificate',
    error: 'invalid_token',
    description: 'The access token is bound to another client certificate',
    retryable: false,
  },
};

/** Answers as the guard's glue does: 401, its Bearer challenge, its problem. */
const refuse = (res: ServerResponse, code: keyof typeof refusals) => refuseAsGuard(res, refusals[code]);

/** A client on fake time, and a getToken that records what it was asked and gives a new token on refresh. */
const clientFor = (url: string) => clientWithTokens(url);

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
