// Audit (branch audit-refapp): what the gateway answers while it starts. A port bound beforehand with
// listen() (so that the provider and the app know the gateway's URL) takes connections from the start,
// long before the gateway can check a token: discovery of the provider alone may take seconds.
// DESIGN.md: every error of the gateway is application/problem+json, and an unavailable service is
// 503 with Retry-After. Every answer before the gateway is ready must be that, whatever the request.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ListeningPort, listen } from '../src/listen.js';
import { sendBytes } from './hostile-send.js';

// Loopback, so the guard takes its http: JWKS URL; nothing listens there, and nothing here fetches it.
const issuer = 'http://127.0.0.1:1/issuer';

let port: ListeningPort;
let release: () => void = () => undefined;
let started: ReturnType<typeof import('../src/gateway/server.js')['startGateway']> | undefined;
let discoveryAsked: Promise<void>;

beforeAll(async () => {
  port = await listen(0);
  const held = new Promise<void>((resolve) => {
    release = resolve;
  });
  let asked: () => void = () => undefined;
  discoveryAsked = new Promise<void>((resolve) => {
    asked = resolve;
  });
  // The provider's discovery answers only when the test says so: until then the gateway is starting.
  const fetch: typeof globalThis.fetch = async () => {
    asked();
    await held;
    return Response.json({ issuer, jwks_uri: 'http://127.0.0.1:1/jwks' });
  };
  const { startGateway } = await import('../src/gateway/server.js');
  started = startGateway({ port, apiUrl: 'http://127.0.0.1:9', authUrl: issuer, fetch });
  await discoveryAsked;
}, 60_000);

afterAll(async () => {
  release();
  const gateway = await started?.catch(() => undefined);
  if (gateway) await gateway.close();
  else await port?.close();
});

function expectStartingUp(answer: { status: number; headers: Headers; text: string }) {
  expect(answer.status).toBe(503);
  expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(answer.headers.get('retry-after')).toMatch(/^[1-9]\d*$/);
  expect(answer.headers.get('cache-control')).toBe('no-store');
  expect(JSON.parse(answer.text)).toMatchObject({ status: 503, code: 'starting_up', retryable: true });
}

async function send(method: string, path: string, init: RequestInit = {}) {
  const response = await fetch(new URL(path, port.url), { method, ...init });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

/** Reads the head of a raw answer into fetch's Headers. */
function headersOf(head: string): Headers {
  const headers = new Headers();
  for (const line of head.split('\r\n').slice(1)) {
    const colon = line.indexOf(':');
    if (colon > 0) headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  return headers;
}

describe('the gateway before it is ready', () => {
  // Was wrong: listen()'s answer before a handler is attached was `text/plain` "Starting up".
  it.each([
    ['GET', '/photos'],
    ['GET', '/.well-known/oauth-protected-resource'],
    ['GET', '/health'],
    ['GET', '/healthz'],
    ['OPTIONS', '/photos'],
    ['DELETE', '/photos/p-1'],
  ])('answers %s %s with a 503 problem and Retry-After', async (method, path) => {
    expectStartingUp(await send(method, path, { headers: { authorization: 'Bearer not.a.token' } }));
  });

  it('answers a body the parser would refuse (a media type that does not parse) with the same 503', async () => {
    expectStartingUp(
      await send('POST', '/stock/batch', { headers: { 'content-type': '"' }, body: '{"items":["item-1"]}' }),
    );
  });

  it.each([
    ['a method no route takes', 'PROPFIND /photos HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'],
    ['a path that does not decode', 'GET /%E0%A4%A HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'],
    ['an asterisk-form OPTIONS', 'OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'],
    // Node's parser refuses these before any handler: its default answer is a bare 400 or 431.
    ['a head that does not parse', 'NOT A REQUEST\r\n\r\n'],
    ['headers over the size limit', `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`],
  ])('answers %s with the same 503', async (_name, bytes) => {
    const answer = await sendBytes(port.url, bytes);
    expectStartingUp({ status: answer.status, headers: headersOf(answer.head), text: answer.body });
  });

  it('answers as the gateway once ready: no token is 401', async () => {
    release();
    await started;
    const answer = await send('GET', '/photos');
    expect(answer.status).toBe(401);
    expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  });
});
