import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readCookie, serializeCookie } from './cookies.js';

/**
 * CSRF protection for HTML forms, by signed double submit: the browser holds a random value in an
 * HttpOnly, SameSite=Lax cookie; the form carries HMAC(key, cookie value + binding). A cross-site
 * page can neither read the cookie nor compute the HMAC, and the binding (an interaction uid, a session)
 * stops a token from one form being replayed on another.
 *
 * Lax, not Strict: pages with these forms are reached by cross-site navigations (the app sends the
 * browser to the provider, the provider sends it back). A Strict cookie is not sent with them, so each
 * such page made a new secret and the forms of tabs already open failed with 403. Lax sends it with
 * a top-level GET only, never with a cross-site POST, and the secret is worthless without the key.
 *
 * @example
 * ```ts
 * const csrf = createCsrf({ key, cookieName: 'idp_csrf', path: '/interaction', secure: false });
 * const token = csrf.issue(req, res, uid);   // put in a hidden field
 * if (!csrf.verify(req, uid, req.body.csrf)) refuse();
 * ```
 */
export interface Csrf {
  issue(req: IncomingMessage, res: ServerResponse, binding: string): string;
  verify(req: IncomingMessage, binding: string, token: unknown): boolean;
}

/** Settings for {@link createCsrf}. */
export interface CsrfOptions {
  key: string;
  cookieName: string;
  path: string;
  secure: boolean;
}

/**
 * Creates a {@link Csrf} guard.
 *
 * @example
 * ```ts
 * const csrf = createCsrf({ key: await loadCsrfKey(db), cookieName: 'idp_csrf', path: '/', secure: false });
 * ```
 */
export function createCsrf(options: CsrfOptions): Csrf {
  const sign = (secret: string, binding: string) =>
    createHmac('sha256', options.key).update(`${secret}\u0000${binding}`).digest('base64url');
  return {
    issue(req, res, binding) {
      let secret = readCookie(req, options.cookieName);
      if (!secret || secret.length < 32) {
        secret = randomBytes(32).toString('base64url');
        res.appendHeader(
          'Set-Cookie',
          serializeCookie(options.cookieName, secret, {
            path: options.path,
            sameSite: 'Lax',
            secure: options.secure,
          }),
        );
      }
      return sign(secret, binding);
    },
    verify(req, binding, token) {
      const secret = readCookie(req, options.cookieName);
      if (!secret || typeof token !== 'string') return false;
      const expected = Buffer.from(sign(secret, binding));
      const given = Buffer.from(token);
      return expected.length === given.length && timingSafeEqual(expected, given);
    },
  };
}
