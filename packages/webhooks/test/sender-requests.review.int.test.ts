// Review: what the sender puts on the wire, checked against a real HTTP server and Node's own fetch.
import { createServer, type IncomingHttpHeaders } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { listen } from '../../core/test/support/timeouts-kit.js';
import { createSender } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (closers.length) await closers.pop()!();
});

/** A real endpoint that answers 204 and keeps the headers and body size of every request. */
async function endpoint() {
  const seen: { headers: IncomingHttpHeaders; bytes: number }[] = [];
  const server = createServer(async (request, response) => {
    let bytes = 0;
    for await (const chunk of request) bytes += (chunk as Buffer).length;
    seen.push({ headers: request.headers, bytes });
    response.statusCode = 204;
    response.end();
  });
  const { url, close } = await listen(server);
  closers.push(close);
  return { url: `${url}/hooks`, seen };
}

const body = '{"type":"payment.succeeded"}';

describe('headers no attempt could send', () => {
  // Node's fetch (undici) accepts these in `new Headers()` but refuses them when it sends, on every
  // attempt: such a message was retried as a network-error until the horizon (24 h by default).
  it.each([
    ['transfer-encoding', 'chunked'],
    ['Keep-Alive', 'timeout=5'],
    ['upgrade', 'websocket'],
    ['expect', '100-continue'],
  ])('refuses %s before any request goes out, as the docs promise', async (name, value) => {
    const { url, seen } = await endpoint();
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 2, base: '1ms', cap: '1ms' } });
    await expect(sender.send({ url, id: 'evt_hop', body, headers: { [name]: value } })).rejects.toThrow(TypeError);
    expect(() => createSender({ secret: SECRET, headers: { [name]: value } })).toThrow(TypeError);
    expect(seen).toHaveLength(0);
  });

  // fetch counts the body itself; a caller's Content-Length can only agree with it or break every
  // attempt (undici: "Request body length does not match content-length header"). send() refuses it
  // (signer-headers.test.ts); attempt(), the relay's path, still sends a row an earlier version
  // stored with one, with the length of the body it sends.
  it('attempt() sends the length of the body it sends, whatever Content-Length a stored row holds', async () => {
    const { url, seen } = await endpoint();
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 1 } });
    const wrong = await sender.attempt({ url, id: 'evt_len', body, headers: { 'Content-Length': '3' } }, 1);
    expect(wrong.result).toBe('delivered');
    const right = await sender.attempt(
      { url, id: 'evt_len2', body, headers: { 'content-length': String(body.length) } },
      1,
    );
    expect(right.result).toBe('delivered');
    await expect(sender.send({ url, id: 'evt_len3', body, headers: { 'Content-Length': '3' } })).rejects.toThrow(
      TypeError,
    );
    expect(seen.map((request) => [request.headers['content-length'], request.bytes])).toEqual([
      [String(body.length), body.length],
      [String(body.length), body.length],
    ]);
  });
});

describe('sender.attempt() with a signal', () => {
  it('makes no request when the signal was aborted before the attempt, and says so', async () => {
    const { url, seen } = await endpoint();
    const sender = createSender({ secret: SECRET });
    const record = await sender.attempt({ url, id: 'evt_abort', body }, 1, { signal: AbortSignal.abort() });
    expect(record).toMatchObject({ result: 'network-error', error: 'aborted by the caller' });
    expect(seen).toHaveLength(0);
  });
});

describe('a fetch that fails without an Error', () => {
  // send() promises a DeliveryResult for every failed delivery; reading `.cause` off `undefined`
  // threw inside the catch, and send() rejected instead.
  it.each([undefined, null, 'refused'])('records a rejection with %s as a network error', async (reason) => {
    const sender = createSender({
      secret: SECRET,
      schedule: { maxAttempts: 1 },
      fetch: (() => Promise.reject(reason)) as typeof fetch,
    });
    const result = await sender.send({ url: 'http://127.0.0.1:9/hooks', id: 'evt_odd', body });
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'max-attempts' });
    expect(result.attempts[0]).toMatchObject({ result: 'network-error', error: 'network error' });
  });
});
