import type { IncomingMessage } from 'node:http';

/**
 * Reads one cookie from a request's `Cookie` header, or `undefined`.
 *
 * @example
 * ```ts
 * const id = readCookie(req, 'app_session');
 * ```
 */
export function readCookie(req: IncomingMessage, name: string): string | undefined {
  const header = req.headers.cookie;
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq === -1) continue;
    if (part.slice(0, eq).trim() !== name) continue;
    const raw = part.slice(eq + 1).trim();
    try {
      return decodeURIComponent(raw);
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/** Attributes for {@link serializeCookie}; HttpOnly is always set, because no page script needs a cookie. */
export interface CookieAttributes {
  path: string;
  sameSite: 'Strict' | 'Lax';
  /** Add `Secure`; true whenever the page is served over https. */
  secure: boolean;
  /** Seconds; 0 deletes the cookie, absent makes a session cookie. */
  maxAge?: number;
}

/**
 * Builds a `Set-Cookie` value.
 *
 * @example
 * ```ts
 * res.append('Set-Cookie', serializeCookie('app_session', id, { path: '/', sameSite: 'Lax', secure: false }));
 * ```
 */
export function serializeCookie(name: string, value: string, attributes: CookieAttributes): string {
  const parts = [
    `${name}=${encodeURIComponent(value)}`,
    `Path=${attributes.path}`,
    'HttpOnly',
    `SameSite=${attributes.sameSite}`,
  ];
  if (attributes.secure) parts.push('Secure');
  if (attributes.maxAge !== undefined) parts.push(`Max-Age=${attributes.maxAge}`);
  return parts.join('; ');
}
