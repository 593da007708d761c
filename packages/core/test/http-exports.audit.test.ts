import type { IncomingMessage } from 'node:http';
import { describe, expect, it } from 'vitest';
import { IdempotencyError } from '../src/errors.js';
import { carriesBody } from '../src/http-body.js';
import { isLeaseLost } from '../src/http-problem.js';

// Mutation test of isLeaseLost's context check (the adapters answer only their own execution's lost
// lease): without a unit test, only an integration test against Redis held it.

const lost = () =>
  new IdempotencyError('lease_lost', 'Lease lost (renew-refused): retry with the same key.', { retryAfter: 1 });

function contextLostWith(reason: IdempotencyError) {
  const controller = new AbortController();
  controller.abort(reason);
  return { signal: controller.signal };
}

describe('isLeaseLost', () => {
  it("is true for the execution's own reason, false for another execution's", () => {
    const own = lost();
    const other = lost();
    expect(isLeaseLost(own, contextLostWith(own))).toBe(true);
    expect(isLeaseLost(other, contextLostWith(own))).toBe(false);
    expect(isLeaseLost(other, { signal: new AbortController().signal })).toBe(false);
  });

  it('without a context, is true for any lease_lost, and false for other errors', () => {
    expect(isLeaseLost(lost())).toBe(true);
    expect(isLeaseLost(new IdempotencyError('in_progress', 'Still running.', { retryAfter: 1 }))).toBe(false);
    expect(isLeaseLost(new Error('lease_lost'))).toBe(false);
  });
});

// carriesBody is exported (the webhooks' Fastify receiver asks it too) and had no test of its own:
// a mutant that took `Content-Length: 0` for a body survived the suites, where an earlier check
// (a stream already ended) answers first.
describe('carriesBody', () => {
  const request = (headers: Record<string, string>, h2?: { endAfterHeaders: boolean }) =>
    ({
      headers,
      httpVersionMajor: h2 === undefined ? 1 : 2,
      ...(h2 ? { stream: h2 } : {}),
    }) as unknown as IncomingMessage;

  it('reads the framing: Content-Length above 0 or Transfer-Encoding is a body, Content-Length: 0 or neither none', () => {
    expect(carriesBody(request({ 'content-length': '0' }))).toBe(false);
    expect(carriesBody(request({ 'content-length': '1' }))).toBe(true);
    expect(carriesBody(request({ 'transfer-encoding': 'chunked' }))).toBe(true);
    expect(carriesBody(request({}))).toBe(false);
  });

  it('over HTTP/2, a stream not ended with its headers carries one, even without Content-Length', () => {
    expect(carriesBody(request({}, { endAfterHeaders: false }))).toBe(true);
    expect(carriesBody(request({}, { endAfterHeaders: true }))).toBe(false);
    expect(carriesBody(request({ 'content-length': '0' }, { endAfterHeaders: false }))).toBe(false);
  });
});
