import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { providerRouteAt, providerRoutes } from '../src/idp/methods.js';
import type { RunningReferenceApp } from '../src/start.js';
import { startTestIdp, type TestIdp } from './test-idp.js';

// A method a path of the identity provider does not take: 405 with Allow, in the path's format. The
// provider's routes are a table of ours (its router keeps them to itself), so the first tests also
// keep that table honest: every method goes to every path, and the provider's answer must agree.

let started: TestIdp;
let running: RunningReferenceApp;

beforeAll(async () => {
  started = await startTestIdp('idp_methods');
  ({ running } = started);
}, 60_000);

afterAll(() => started?.close());

const methods = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];
const concrete = (path: string) => path.replace(':uid', 'no-such-interaction');

async function send(method: string, path: string) {
  const response = await fetch(new URL(path, running.authUrl), {
    method,
    redirect: 'manual',
    ...(method === 'POST' ? { headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: '' } : {}),
  });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

describe("the provider's paths", () => {
  it('answers every method the table lists from the provider itself, and every other with 405 and Allow', async () => {
    for (const route of providerRoutes) {
      const allow = route.methods.includes('OPTIONS') ? route.methods : [...route.methods, 'OPTIONS'];
      for (const method of methods) {
        const where = `${method} ${route.path}`;
        const answer = await send(method, concrete(route.path));
        if (method === 'OPTIONS') {
          // The provider answers CORS preflights; a bare OPTIONS it leaves to us.
          expect(answer.status, where).toBe(204);
          if (!answer.headers.get('access-control-allow-origin')) {
            expect(answer.headers.get('allow'), where).toBe(allow.join(', '));
          }
        } else if (route.methods.includes(method)) {
          // Koa's untouched plain-text 404 would say the provider has no such route: the table is wrong.
          expect(`${answer.status} ${answer.text}`, where).not.toBe('404 Not Found');
          expect(answer.status, where).not.toBe(405);
        } else {
          expect(answer.status, `${where}: ${answer.text.slice(0, 200)}`).toBe(405);
          expect(answer.headers.get('allow'), where).toBe(allow.join(', '));
        }
      }
    }
  });

  it('lists every endpoint discovery advertises on this issuer', async () => {
    const response = await fetch(new URL('/.well-known/openid-configuration', running.authUrl));
    const metadata = (await response.json()) as Record<string, unknown>;
    const endpoints = Object.entries(metadata).filter(
      ([name, value]) => (name.endsWith('_endpoint') || name === 'jwks_uri') && typeof value === 'string',
    );
    expect(endpoints.length).toBeGreaterThanOrEqual(8);
    for (const [name, value] of endpoints) {
      const url = new URL(value as string);
      if (url.origin !== new URL(running.authUrl).origin) continue;
      expect(providerRouteAt(url.pathname), `${name}: ${url.pathname}`).toBeDefined();
    }
  });

  it('refuses a JSON endpoint in the OAuth error format, with no-store', async () => {
    for (const [method, path, allow] of [
      ['DELETE', '/token', 'POST, OPTIONS'],
      ['PUT', '/me', 'GET, HEAD, POST, OPTIONS'],
      ['POST', '/jwks', 'GET, HEAD, OPTIONS'],
      ['GET', '/token/revocation', 'POST, OPTIONS'],
    ] as const) {
      const answer = await send(method, path);
      expect(answer.status, `${method} ${path}`).toBe(405);
      expect(answer.headers.get('content-type')).toMatch(/^application\/json/);
      expect(answer.headers.get('cache-control')).toBe('no-store');
      expect(JSON.parse(answer.text)).toEqual({
        error: 'invalid_request',
        error_description: `This endpoint takes ${allow}.`,
      });
    }
  });

  it('refuses a page with our page and headers', async () => {
    const answer = await send('DELETE', '/auth');
    expect(answer.status).toBe(405);
    expect(answer.headers.get('allow')).toBe('GET, HEAD, OPTIONS');
    expect(answer.headers.get('content-type')).toMatch(/^text\/html/);
    expect(answer.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    expect(answer.text).toContain('Method not allowed');
  });

  it('matches paths as the provider routes them: any ASCII case, one trailing slash', async () => {
    for (const path of ['/TOKEN', '/Token/', '/token/']) {
      expect((await send('DELETE', path)).status, path).toBe(405);
      // The provider takes the same spellings for the method it serves: not a 404.
      expect((await send('POST', path)).status, path).not.toBe(404);
    }
    // Not a path of the provider's: the 404 stays (a non-ASCII letter never matches an ASCII one).
    for (const path of ['/token//', '/ṫoken', '/token/x', '/auth/']) {
      const answer = await send('DELETE', path);
      expect(answer.status, path).toBe(path === '/auth/' ? 405 : 404);
    }
  });
});

describe('our interaction pages', () => {
  it('answer a method they do not take with 405, Allow and our page; OPTIONS with 204', async () => {
    for (const [method, path, allow] of [
      ['DELETE', '/interaction/abc', 'GET, HEAD, OPTIONS'],
      ['GET', '/interaction/abc/login', 'POST, OPTIONS'],
      ['PUT', '/interaction/abc/consent', 'POST, OPTIONS'],
    ] as const) {
      const answer = await send(method, path);
      expect(answer.status, `${method} ${path}`).toBe(405);
      expect(answer.headers.get('allow'), `${method} ${path}`).toBe(allow);
      expect(answer.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
      expect(answer.text).toContain('Method not allowed');
    }
    const options = await send('OPTIONS', '/interaction/abc/abort');
    expect(options.status).toBe(204);
    expect(options.headers.get('allow')).toBe('POST, OPTIONS');
  });
});
