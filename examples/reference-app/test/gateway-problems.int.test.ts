// The gateway's own refusals carry the codes the API uses for the same statuses (README: callers
// match on `code`, whichever part of the stack refused the request).
import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import { startTestStack, type TestStack } from './test-stack.js';

let test: TestStack;
let stack: RunningResourceStack;

beforeAll(async () => {
  test = await startTestStack('gwproblems');
  ({ stack } = test);
}, 60_000);
afterAll(async () => {
  await test?.close();
});

/** A raw POST through the gateway: fetch would refuse a Content-Type that does not parse. */
function post(path: string, headers: Record<string, string>, body: string) {
  return new Promise<{ status: number; headers: Record<string, unknown>; text: string }>((resolve, reject) => {
    const req = httpRequest(new URL(path, stack.gateway.url), { method: 'POST', headers }, (res) => {
      let text = '';
      res.on('data', (chunk) => {
        text += chunk;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// README: "415 `unsupported_media_type` (not JSON, ...)"; DESIGN: callers match on `code`.
describe('gateway: a 415 Fastify raises has the documented code', () => {
  it.each(['"', '/'])('answers Content-Type %j with 415 unsupported_media_type, as the API does', async (type) => {
    const token = await test.token({ scope: 'photos:write', roles: [] });
    const response = await post(
      '/photos',
      { authorization: `Bearer ${token}`, 'content-type': type, 'idempotency-key': `"${randomUUID()}"` },
      '{"title":"x"}',
    );
    expect(response.status).toBe(415);
    expect(response.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(JSON.parse(response.text)).toMatchObject({ status: 415, code: 'unsupported_media_type' });
  });
});

describe('frameworkProblem', () => {
  it('maps what Fastify and reply-from raise to the documented problems', async () => {
    const { frameworkProblem } = await import('../src/gateway/problems.js');
    const raised = (statusCode: number, code?: string, message = 'x') =>
      Object.assign(new Error(message), { statusCode, code });
    expect(frameworkProblem(raised(400, 'FST_ERR_BAD_URL'))).toMatchObject({
      status: 400,
      code: 'path_malformed',
      retryable: false,
    });
    expect(frameworkProblem(raised(400, undefined, 'source/request contain invalid characters'))).toMatchObject({
      code: 'path_malformed',
    });
    expect(frameworkProblem(raised(400, 'FST_ERR_CTP_EMPTY_JSON_BODY'))).toMatchObject({
      status: 400,
      code: 'request_refused',
    });
    expect(frameworkProblem(raised(413, 'FST_ERR_CTP_BODY_TOO_LARGE'))).toMatchObject({
      status: 413,
      code: 'body_too_large',
      retryable: false,
    });
    expect(frameworkProblem(raised(415, 'FST_ERR_CTP_INVALID_MEDIA_TYPE'))).toMatchObject({
      status: 415,
      code: 'unsupported_media_type',
      retryable: false,
    });
    expect(frameworkProblem(raised(503))).toMatchObject({ status: 503, code: 'upstream_unavailable', retryable: true });
    expect(frameworkProblem(raised(504))).toMatchObject({ status: 504, code: 'upstream_timeout', retryable: true });
    expect(frameworkProblem(new Error('boom'))).toMatchObject({
      status: 500,
      code: 'internal_error',
      retryable: true,
    });
    expect(frameworkProblem(raised(599))).toMatchObject({ status: 500, code: 'internal_error' });
    // A status outside 400 to 599 on an error is no answer to pass on: the gateway's own fault.
    for (const status of [302, 399, 600]) {
      expect(frameworkProblem(raised(status))).toMatchObject({ status: 500, code: 'internal_error' });
    }
  });
});

describe("gateway: requests Node's parser refuses", () => {
  /** Sends raw bytes and reads until the gateway closes the connection. */
  function raw(bytes: string) {
    return new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(new URL(stack.gateway.url).port), '127.0.0.1');
      let text = '';
      socket.on('data', (chunk) => {
        text += chunk;
      });
      socket.on('error', reject);
      socket.on('close', () => resolve(text));
      socket.end(bytes);
    });
  }
  const problemOf = (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));

  it("are answered as problems (400 for a malformed head, 431 for oversize headers), not Fastify's JSON", async () => {
    // Was a defect: Fastify's default client-error handler answered {"error":"Bad Request","message":"Client Error"}.
    const malformed = await raw('POST /charges HTTP/1.1\r\nHost: gateway\r\nNot a header line\r\n\r\n');
    expect(malformed).toMatch(/^HTTP\/1\.1 400 /);
    expect(malformed).toMatch(/\r\ncontent-type: application\/problem\+json\r\n/i);
    expect(problemOf(malformed)).toMatchObject({ status: 400, code: 'request_refused', retryable: false });
    const oversize = await raw(`GET /photos HTTP/1.1\r\nHost: gateway\r\nX-Pad: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(oversize).toMatch(/^HTTP\/1\.1 431 /);
    expect(problemOf(oversize)).toMatchObject({ status: 431, code: 'request_refused' });
  });
});
