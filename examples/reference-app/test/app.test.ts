import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Principal } from '@idem/guard';
import type { Request } from 'express';
import { describe, expect, it } from 'vitest';
import { principalOf } from '../src/api/internal-auth.js';
import { cookieNames, safeReturnTo } from '../src/app/server.js';
import { clientErrorStatus } from '../src/client-error.js';
import { readCookie, serializeCookie } from '../src/cookies.js';
import { createCsrf } from '../src/csrf.js';
import { assertRedirectUris } from '../src/idp/clients.js';
import { oidcScopes } from '../src/idp/provider.js';
import { apiScopes, asksForApiScope, carriesRoleScope } from '../src/scopes.js';

describe('safeReturnTo (row 37)', () => {
  it.each([
    ['/', '/'],
    ['/photos?x=1', '/photos?x=1'],
    ['//evil.example', '/'],
    ['/\\evil.example', '/'],
    ['https://evil.example', '/'],
    ['javascript:alert(1)', '/'],
    ['/ok\r\nSet-Cookie: x=1', '/'],
    [undefined, '/'],
    [['/a', '/b'], '/'],
  ])('%j becomes %j', (input, expected) => {
    expect(safeReturnTo(input)).toBe(expected);
  });
});

describe('assertRedirectUris (row 31)', () => {
  it('refuses a client without redirect URIs', () => {
    expect(() => assertRedirectUris({ client_id: 'x' })).toThrow(TypeError);
  });

  it.each([
    // An empty fragment parses to hash '' but is a fragment all the same (RFC 6749 section 3.1.2).
    ['an empty fragment', 'https://app.example/callback#'],
    ['a scheme that is neither https nor http', 'ftp://app.example/callback'],
    ['a script URL', 'javascript://app.example/%0aalert(1)'],
    ['http on a host that only starts like loopback', 'http://127.0.0.1.evil.example/callback'],
    ['not a URL', 'callback'],
    // RFC 9110 section 4.2.4: an http(s) URI carries no user information; one that does reads as a
    // host to a person and as another to a parser (https://app.example@evil.example/cb).
    ['user information', 'https://app.example@evil.example/callback'],
    ['a user and password', 'https://user:pw@app.example/callback'],
  ])('refuses a redirect URI with %s', (_name, uri) => {
    expect(() => assertRedirectUris({ client_id: 'x', redirect_uris: ['https://app.example/ok', uri] })).toThrow(
      TypeError,
    );
  });

  it.each([
    ['http on a public host', 'http://app.example/signed-out'],
    ['a fragment', 'https://app.example/signed-out#x'],
    ['user information', 'https://app.example@evil.example/signed-out'],
    ['not a URL', 'signed-out'],
  ])('refuses a post-logout redirect URI with %s, as a redirect URI', (_name, uri) => {
    expect(() =>
      assertRedirectUris({
        client_id: 'x',
        redirect_uris: ['https://app.example/ok'],
        post_logout_redirect_uris: ['https://app.example/signed-out', uri],
      }),
    ).toThrow(/^client x: post_logout_redirect_uri /);
  });

  it('allows post-logout redirect URIs on https and on loopback http', () => {
    expect(() =>
      assertRedirectUris({
        client_id: 'x',
        redirect_uris: ['https://app.example/ok'],
        post_logout_redirect_uris: ['https://app.example/signed-out', 'http://127.0.0.1:8083/'],
      }),
    ).not.toThrow();
  });

  it('allows http on every loopback name, IPv6 included (RFC 8252 section 7.3)', () => {
    expect(() =>
      assertRedirectUris({ client_id: 'x', redirect_uris: ['http://[::1]:8765/callback', 'http://localhost/cb'] }),
    ).not.toThrow();
  });
});

describe('README', () => {
  it('lists every scope the provider issues, and no other', () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    // The bullet may wrap: it runs until the next bullet or blank line.
    const bullet = /^- Scopes:([\s\S]*?)(?=\n- |\n\n)/m.exec(readme)?.[1] ?? '';
    const listed = [...bullet.matchAll(/`([^`]+)`/g)].flatMap((match) => (match[1] ?? '').split(/\s+/));
    const issued = [...oidcScopes, ...apiScopes];
    const scopes = new Set(listed.filter((name) => /^[a-z_]+(:[a-z]+)?$/.test(name)));
    expect([...scopes].sort()).toEqual([...issued].sort());
  });
});

/** A request carrying `cookie`, and a response that records its Set-Cookie headers: all csrf.ts touches. */
function exchange(cookie?: string) {
  const setCookies: string[] = [];
  const req = { headers: cookie === undefined ? {} : { cookie } } as IncomingMessage;
  const res = {
    appendHeader(name: string, value: string) {
      if (name.toLowerCase() === 'set-cookie') setCookies.push(value);
      return this;
    },
  } as unknown as ServerResponse;
  return { req, res, setCookies };
}

describe('createCsrf (the forms of the provider and the app)', () => {
  const csrf = createCsrf({ key: 'test-key', cookieName: 'idp_csrf', path: '/interaction', secure: true });
  const secret = 'a'.repeat(43);

  it('keeps its secret in an HttpOnly, SameSite=Lax cookie on its path, Secure when asked', () => {
    const { req, res, setCookies } = exchange();
    csrf.issue(req, res, 'uid-1');
    expect(setCookies).toHaveLength(1);
    const attributes = (setCookies[0] ?? '').split('; ').slice(1);
    // Lax, not Strict: see csrf-cross-site.e2e.test.ts for what Strict broke.
    expect(attributes).toEqual(expect.arrayContaining(['HttpOnly', 'SameSite=Lax', 'Path=/interaction', 'Secure']));
    expect(attributes).not.toContain('SameSite=Strict');
    const plain = exchange();
    createCsrf({ key: 'test-key', cookieName: 'app_csrf', path: '/', secure: false }).issue(plain.req, plain.res, 'x');
    expect(plain.setCookies[0]).not.toMatch(/Secure/);
  });

  it("sets the app's CSRF cookie as a __Host- cookie over https: Secure, Path=/, no Domain", () => {
    const { req, res, setCookies } = exchange();
    createCsrf({ key: 'test-key', cookieName: cookieNames(true).csrf, path: '/', secure: true }).issue(req, res, 'x');
    const cookie = setCookies[0] ?? '';
    expect(cookie.startsWith('__Host-app_csrf=')).toBe(true);
    expect(cookie.split('; ')).toEqual(expect.arrayContaining(['Secure', 'Path=/']));
    expect(cookie).not.toMatch(/Domain=/i);
    expect(cookieNames(false)).toEqual({ session: 'app_session', csrf: 'app_csrf' });
  });

  it('keeps a secret the browser already holds, so two open forms both stay valid', () => {
    const { req, res, setCookies } = exchange(`idp_csrf=${secret}`);
    const first = csrf.issue(req, res, 'uid-1');
    const second = csrf.issue(req, res, 'uid-1');
    expect(setCookies).toEqual([]);
    expect(second).toBe(first);
    expect(csrf.verify(req, 'uid-1', first)).toBe(true);
  });

  // Mutation pass: the edge of "too short". 32 characters is the least a secret may have (the ones
  // it sets have 43, 32 random bytes); one character less is replaced.
  it('keeps a held secret of 32 characters and replaces one of 31', () => {
    const kept = exchange(`idp_csrf=${'k'.repeat(32)}`);
    csrf.issue(kept.req, kept.res, 'uid-1');
    expect(kept.setCookies).toEqual([]);
    const replaced = exchange(`idp_csrf=${'k'.repeat(31)}`);
    csrf.issue(replaced.req, replaced.res, 'uid-1');
    expect(replaced.setCookies).toHaveLength(1);
  });

  it('replaces a secret too short to be one it set (a planted cookie), and verifies against the new one only', () => {
    const planted = exchange('idp_csrf=short');
    const token = csrf.issue(planted.req, planted.res, 'uid-1');
    expect(planted.setCookies).toHaveLength(1);
    const fresh = decodeURIComponent(/^idp_csrf=([^;]+)/.exec(planted.setCookies[0] ?? '')?.[1] ?? '');
    expect(fresh).not.toBe('short');
    expect(fresh.length).toBeGreaterThanOrEqual(32);
    expect(csrf.verify(exchange(`idp_csrf=${fresh}`).req, 'uid-1', token)).toBe(true);
    expect(csrf.verify(planted.req, 'uid-1', token)).toBe(false);
  });

  it('binds a token to its form: a token for one interaction or session is refused for another', () => {
    const { req, res } = exchange(`idp_csrf=${secret}`);
    const token = csrf.issue(req, res, 'uid-1');
    expect(csrf.verify(req, 'uid-1', token)).toBe(true);
    expect(csrf.verify(req, 'uid-2', token)).toBe(false);
    // Another browser (another secret) cannot use it either.
    expect(csrf.verify(exchange(`idp_csrf=${'b'.repeat(43)}`).req, 'uid-1', token)).toBe(false);
    expect(csrf.verify(exchange().req, 'uid-1', token)).toBe(false);
  });

  it('signs with its key: a browser that knows its own cookie still cannot compute a token', () => {
    const { req } = exchange(`idp_csrf=${secret}`);
    // HMAC under any other key, the empty one included, is no token, even with the right cookie and binding.
    for (const key of ['', 'another-key']) {
      const forged = createHmac('sha256', key).update(`${secret}\u0000uid-1`).digest('base64url');
      expect(csrf.verify(req, 'uid-1', forged)).toBe(false);
    }
    const { res } = exchange(`idp_csrf=${secret}`);
    expect(csrf.issue(req, res, 'uid-1')).toBe(
      createHmac('sha256', 'test-key').update(`${secret}\u0000uid-1`).digest('base64url'),
    );
  });

  it('refuses a token of another length, or not a string, with false rather than an exception', () => {
    const { req, res } = exchange(`idp_csrf=${secret}`);
    const token = csrf.issue(req, res, 'uid-1');
    for (const given of [token.slice(1), `${token}x`, '', undefined, 42, [token]]) {
      expect(csrf.verify(req, 'uid-1', given)).toBe(false);
    }
  });
});

describe('cookies', () => {
  it('always marks a cookie HttpOnly, Secure only when asked, and deletes it with Max-Age=0', () => {
    expect(serializeCookie('app_session', 'id', { path: '/', sameSite: 'Lax', secure: false })).toBe(
      'app_session=id; Path=/; HttpOnly; SameSite=Lax',
    );
    expect(serializeCookie('app_session', '', { path: '/', sameSite: 'Lax', secure: true, maxAge: 0 })).toBe(
      'app_session=; Path=/; HttpOnly; SameSite=Lax; Secure; Max-Age=0',
    );
  });

  it('encodes the value, so a value cannot add attributes of its own, and reads it back decoded', () => {
    const header = serializeCookie('n', 'x; Domain=evil.example', { path: '/', sameSite: 'Strict', secure: false });
    expect(header).toBe('n=x%3B%20Domain%3Devil.example; Path=/; HttpOnly; SameSite=Strict');
    const cookie = header.split('; ')[0] ?? '';
    expect(readCookie({ headers: { cookie } } as IncomingMessage, 'n')).toBe('x; Domain=evil.example');
  });

  it('reads a cookie by its exact name, never by a name it only starts or ends with', () => {
    const req = (cookie: string) => ({ headers: { cookie } }) as IncomingMessage;
    // A cookie another app on the same host set, named like ours plus a suffix, must not pass for ours.
    expect(readCookie(req('app_session_old=planted; app_session=mine'), 'app_session')).toBe('mine');
    expect(readCookie(req('app_session_old=planted'), 'app_session')).toBeUndefined();
    expect(readCookie(req('x_app_session=planted'), 'app_session')).toBeUndefined();
    expect(readCookie(req('flag; app_session=mine'), 'app_session')).toBe('mine');
    expect(readCookie(req('app_session=%zz'), 'app_session')).toBeUndefined();
  });
});

describe('clientErrorStatus (which errors blame the request)', () => {
  const httpError = (status: number, expose?: boolean) =>
    Object.assign(new Error('refused'), expose === undefined ? { status } : { status, expose });

  it('passes an exposed 4xx, and the router’s URIError 400, through', () => {
    expect(clientErrorStatus(httpError(400, true))).toBe(400);
    expect(clientErrorStatus(httpError(499, true))).toBe(499);
    expect(clientErrorStatus(Object.assign(new URIError('bad path'), { status: 400 }))).toBe(400);
  });

  // Was wrong: only `status` was read; an exposed 4xx that carries its status as `statusCode` alone
  // (Express's finalhandler reads either) stayed a 500, or a 503 when its code read as a lost connection.
  it('reads `statusCode` when there is no `status`, as Express does', () => {
    const socketError = Object.assign(new Error('aborted'), { code: 'ECONNRESET', statusCode: 400, expose: true });
    expect(clientErrorStatus(socketError)).toBe(400);
    expect(clientErrorStatus(Object.assign(new Error('x'), { statusCode: 500, expose: true }))).toBeUndefined();
    expect(clientErrorStatus(Object.assign(new Error('x'), { status: 500, statusCode: 400, expose: true }))).toBe(
      undefined,
    );
  });

  it.each([
    ['a 3xx, even exposed', httpError(399, true)],
    ['a 5xx, even exposed', httpError(500, true)],
    ['a 4xx without expose (its message was not meant for the client)', httpError(400)],
    ['a 4xx with expose false', httpError(404, false)],
    ['a plain Error with status 400 that is no URIError', httpError(400, false)],
    ['a URIError with another status', Object.assign(new URIError('bad path'), { status: 404 })],
    ['a fractional status', httpError(400.5, true)],
    ['not an object', 'error'],
  ])('treats %s as no client error (a 500)', (_name, error) => {
    expect(clientErrorStatus(error)).toBeUndefined();
  });
});

describe('which token carries the roles', () => {
  it('asks for the API when any one API scope is asked for', () => {
    expect(asksForApiScope('openid photos:read')).toBe(true);
    expect(asksForApiScope('openid profile')).toBe(false);
    expect(asksForApiScope(undefined)).toBe(false);
  });

  it('carries roles next to any one scope that acts with them, and only those', () => {
    expect(carriesRoleScope('openid stock:write')).toBe(true);
    for (const scope of ['events:read', 'events:write']) expect(carriesRoleScope(`photos:read ${scope}`)).toBe(true);
    // The photo app's scopes: its token never acts with alice's admin role.
    expect(
      carriesRoleScope(
        'openid profile email offline_access photos:read stock:read charges:write settings:read settings:write',
      ),
    ).toBe(false);
    expect(carriesRoleScope('stock:writer')).toBe(false);
  });
});

describe('principalOf', () => {
  it('throws for a route that internalAuth did not run for, never answering as "anonymous"', () => {
    expect(() => principalOf({} as Request)).toThrow(/internalAuth did not run/);
    const auth = { sub: 'user-alice' } as Principal;
    expect(principalOf({ auth } as Request)).toBe(auth);
  });
});
