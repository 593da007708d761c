// The request line and the Host header, sent over raw sockets (fetch and node:http set the Host header
// themselves and send only origin-form targets): a Host header that is not a host, and an absolute-form
// request target (RFC 9112 section 3.2.2, which a server must accept) whose authority does not parse.
// DESIGN's rule: bad input gets a clear error (a 4xx), never a 500. Each case below once answered 500;
// the comments say where the error came from. Every service now brings an absolute-form target to the
// origin form, or answers 400 path_malformed (src/request-target.ts), and the identity provider builds
// its URLs on the issuer's host, whatever the Host header says.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authorizationUrl } from './flow.js';
import { sendBytes } from './hostile-send.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { pkcePair } from './user-agent.js';

const limitMs = 5000;
let whole: WholeStack;

beforeAll(async () => {
  whole = await startWholeStack('hostile_target');
}, 60_000);
afterAll(async () => {
  await whole?.close();
});

/** Writes `bytes` to `base`'s port as they are and reads until the server closes (or the limit). */
const sendRaw = (base: string, bytes: string) => sendBytes(base, bytes, limitMs);

/** A GET with the request target and Host header given, as they are. */
const get = (base: string, target: string, host: string, cookie?: string) =>
  sendRaw(
    base,
    `GET ${target} HTTP/1.1\r\nHost: ${host}\r\n${cookie ? `Cookie: ${cookie}\r\n` : ''}Connection: close\r\n\r\n`,
  );

/** Hosts a client can put in the Host header that no URL parser takes. */
const badHosts = ['x:99999', '[', 'a b', '%zz'];

describe('the identity provider under a Host header that is not a host', () => {
  // oidc-provider builds every URL it hands out with `new URL(path, ctx.href)` (OIDCContext.urlFor,
  // node_modules/oidc-provider/lib/helpers/oidc_context.js:84), and Koa's `href` is the request's
  // protocol + Host header + path. A Host no URL parser takes makes that throw a TypeError, which the
  // provider answers as 500 server_error: discovery, the authorization endpoint (urlFor of the resume
  // URL, actions/authorization/interactions.js:102, before any interaction is stored) and end_session.
  // Nothing in src/idp/server.ts looks at the Host header before `provider.callback()`.
  it('answers discovery, authorization and end_session with a 4xx, not a 500', async () => {
    const { app } = whole.running.clients;
    const authorize = authorizationUrl(whole.running.authUrl, {
      clientId: app.clientId,
      redirectUri: app.redirectUri,
      challenge: pkcePair().challenge,
      challengeMethod: 'S256',
      scope: 'openid',
    });
    const { pathname, search } = new URL(authorize);
    const paths = ['/.well-known/openid-configuration', `${pathname}${search}`, '/session/end'];
    const answered: string[] = [];
    for (const host of badHosts) {
      for (const path of paths) {
        const answer = await get(whole.running.authUrl, path, host);
        answered.push(`Host: ${host} GET ${path.split('?')[0]}: ${answer.status < 500 ? 'below 500' : answer.status}`);
      }
    }
    expect(answered).toEqual(
      badHosts.flatMap((host) => paths.map((path) => `Host: ${host} GET ${path.split('?')[0]}: below 500`)),
    );
  });

  it('still answers a proper Host header (the same requests, for contrast)', async () => {
    const answer = await get(
      whole.running.authUrl,
      '/.well-known/openid-configuration',
      new URL(whole.running.authUrl).host,
    );
    expect(answer.status).toBe(200);
  });

  // The same through an absolute-form request target: Koa's `href` is then the target itself.
  it('answers an absolute-form target whose authority does not parse with a 4xx, not a 500', async () => {
    const host = new URL(whole.running.authUrl).host;
    const answer = await get(whole.running.authUrl, 'http://x:99999/.well-known/openid-configuration', host);
    expect(answer.status).toBeLessThan(500);
  });
});

describe('the identity provider under another host', () => {
  // Built from the Host header, discovery once advertised whatever host a client named: a cache in
  // front of it (or a page that reads it) would hand those URLs to everyone.
  it("advertises the issuer's URLs whatever the Host header or an absolute-form target name", async () => {
    const issuer = whole.running.authUrl;
    for (const [target, host] of [
      ['/.well-known/openid-configuration', 'evil.example'],
      ['http://evil.example/.well-known/openid-configuration', new URL(issuer).host],
    ] as const) {
      const answer = await get(issuer, target, host);
      expect(answer.status, target).toBe(200);
      const body = answer.body.slice(answer.body.indexOf('{'), answer.body.lastIndexOf('}') + 1);
      const metadata = JSON.parse(body) as Record<string, unknown>;
      expect(metadata.authorization_endpoint, target).toBe(`${issuer}/auth`);
      expect(answer.body, target).not.toContain('evil.example');
    }
  });
});

describe('the webhook receiver under an absolute-form request target', () => {
  // Koa's `ctx.path` parses `req.url` with parseurl, which hands an absolute-form target to Node's
  // `url.parse`; on Node 24 that throws ERR_INVALID_URL for `http://[/`. The receiver's middlewares
  // read `ctx.path` first thing (src/receiver/server.ts:118 for the page, :308 in adminApi for any
  // other request), so every such request, to the page, the webhook endpoint or the admin API, gets
  // Koa's plain-text 500 "Internal Server Error", not a problem document.
  it('answers GET http://[/ and POST http://[/webhooks/payments with a 4xx problem, not a 500', async () => {
    const { receiver } = whole.stack;
    const host = new URL(receiver.url).host;
    const page = await get(receiver.url, 'http://[/', host);
    const webhook = await sendRaw(
      receiver.url,
      `POST http://[${new URL(receiver.webhookUrl).pathname} HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
    );
    expect([page.status, webhook.status].map((status) => status < 500)).toEqual([true, true]);
    expect(webhook.head).toMatch(/content-type: application\/problem\+json/i);
  });
});

describe('the API under an absolute-form request target', () => {
  // Express builds a URL of the target, which throws for an authority that does not parse: the API's
  // own port (behind the gateway, but a port of its own) answers it as the others do, a 400 problem.
  it('answers GET http://[/charges with a 400 path_malformed problem, not a 500', async () => {
    const { api } = whole.stack;
    const answer = await get(api.url, 'http://[/charges', new URL(api.url).host);
    expect(answer.status).toBe(400);
    expect(answer.head).toMatch(/content-type: application\/problem\+json/i);
    expect(answer.body).toContain('path_malformed');
  });
});

describe('the third-party app under an absolute-form callback', () => {
  // The callback rebuilds its URL as `new URL(req.originalUrl, appUrl)` (src/app/sign-in-routes.ts, getCallback),
  // outside the try that turns a failed sign-in into the 400 page. Express routes
  // `GET http://x:99999/callback?...` to /callback (parseurl's legacy url.parse takes the port), but
  // `new URL` refuses port 99999 and throws: a 500 "Something went wrong" for a sign-in that is
  // already destroyed (the pending session is deleted just before).
  it('answers an absolute-form callback whose authority does not parse with the 400 page', async () => {
    const { appUrl } = whole.running;
    const start = await fetch(new URL('/signin', appUrl), { redirect: 'manual' });
    expect(start.status).toBe(303);
    const cookie = start.headers
      .getSetCookie()
      .map((line) => line.split(';')[0])
      .join('; ');
    const state = new URL(start.headers.get('location') ?? '').searchParams.get('state') ?? '';
    const answer = await get(
      appUrl,
      `http://x:99999/callback?code=x&state=${encodeURIComponent(state)}&iss=x`,
      new URL(appUrl).host,
      cookie,
    );
    expect(answer.status).toBe(400);
    expect(answer.head).toMatch(/content-type: text\/html/i);
  });
});
