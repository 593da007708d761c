import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createSender, createVerifier } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (closers.length) await closers.pop()!();
});

async function serve(handler: (request: IncomingMessage, response: ServerResponse, body: Buffer) => void) {
  const server = createServer(async (request, response) => {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    handler(request, response, Buffer.concat(chunks));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('sender against real HTTP servers', () => {
  it('sends verifiable Standard Webhooks requests', async () => {
    const verifier = createVerifier({ secret: SECRET });
    const verdicts: string[] = [];
    const base = await serve((request, response, body) => {
      const result = verifier.verify({ headers: request.headers, body });
      verdicts.push(result.ok ? `ok:${result.webhook.id}:${request.headers['content-type']}` : result.error.code);
      response.statusCode = result.ok ? 204 : 400;
      response.end();
    });
    const result = await createSender({ secret: SECRET }).send({
      url: `${base}/hooks`,
      id: 'evt_real',
      body: Buffer.from([0x7b, 0xff, 0x7d]),
    });
    expect(result.outcome).toBe('delivered');
    expect(verdicts).toEqual(['ok:evt_real:application/json']);
  });

  it('does not follow a redirect: the 3xx is a failed attempt and the target is never called', async () => {
    let targetHits = 0;
    const target = await serve((_request, response) => {
      targetHits++;
      response.end();
    });
    const base = await serve((_request, response) => {
      response.writeHead(307, { location: `${target}/hooks` });
      response.end();
    });
    const result = await createSender({
      secret: SECRET,
      schedule: { maxAttempts: 2 },
      sleep: async () => undefined,
    }).send({
      url: `${base}/hooks`,
      id: 'evt_redirect',
      body: '{}',
    });
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'max-attempts' });
    expect(result.attempts.map((a) => [a.result, a.status])).toEqual([
      ['failed', 307],
      ['failed', 307],
    ]);
    expect(targetHits).toBe(0);
  });

  it('times out an attempt whose endpoint never answers, then delivers on the retry', async () => {
    let calls = 0;
    const base = await serve((_request, response) => {
      calls++;
      if (calls === 1) return; // never answers
      response.end();
    });
    const waits: number[] = [];
    const result = await createSender({
      secret: SECRET,
      // Long enough that the answered retry never times out on a loaded machine (100 ms did in CI).
      timeout: 1_000,
      sleep: async (ms) => void waits.push(ms),
    }).send({ url: `${base}/hooks`, id: 'evt_timeout', body: '{}' });
    expect(result.outcome).toBe('delivered');
    expect(result.attempts.map((a) => a.result)).toEqual(['timeout', 'delivered']);
    expect(waits).toHaveLength(1);
  });

  it("honours a real endpoint's Retry-After and stops on its 410", async () => {
    let calls = 0;
    const base = await serve((_request, response) => {
      calls++;
      if (calls === 1) {
        response.writeHead(429, { 'retry-after': '42' });
        response.end();
      } else {
        response.statusCode = 410;
        response.end();
      }
    });
    const waits: number[] = [];
    const result = await createSender({ secret: SECRET, sleep: async (ms) => void waits.push(ms) }).send({
      url: `${base}/hooks`,
      id: 'evt_throttled',
      body: '{}',
    });
    expect(waits).toEqual([42_000]);
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'gone' });
    expect(calls).toBe(2);
  });
});
