import type Provider from 'oidc-provider';
import type { KoaContextWithOIDC } from 'oidc-provider';
import { errorPage, pageHeaders } from '../html.js';

type ProviderMiddleware = Parameters<Provider['use']>[0];

/** One of oidc-provider's routes in this configuration, and how it refuses: an OAuth JSON error or a page. */
export interface ProviderRoute {
  readonly path: string;
  readonly methods: readonly string[];
  readonly answers: 'json' | 'page';
}

/**
 * oidc-provider's routes as provider.ts configures it (v9 defaults: no `enableHttpPostMethods`, no
 * registration, device flow or CIBA), with the methods each takes. Its router keeps them to itself, so
 * this table states them; `idp-methods.int.test.ts` sends every method to every path and fails when
 * the provider and the table disagree, and when discovery names an endpoint the table lacks.
 */
export const providerRoutes: readonly ProviderRoute[] = [
  { path: '/auth', methods: ['GET', 'HEAD'], answers: 'page' },
  { path: '/auth/:uid', methods: ['GET', 'HEAD'], answers: 'page' },
  { path: '/session/end', methods: ['GET', 'HEAD'], answers: 'page' },
  { path: '/session/end/confirm', methods: ['POST'], answers: 'page' },
  { path: '/session/end/success', methods: ['GET', 'HEAD'], answers: 'page' },
  { path: '/token', methods: ['POST', 'OPTIONS'], answers: 'json' },
  { path: '/token/introspection', methods: ['POST', 'OPTIONS'], answers: 'json' },
  { path: '/token/revocation', methods: ['POST', 'OPTIONS'], answers: 'json' },
  { path: '/request', methods: ['POST', 'OPTIONS'], answers: 'json' },
  { path: '/me', methods: ['GET', 'HEAD', 'POST', 'OPTIONS'], answers: 'json' },
  { path: '/jwks', methods: ['GET', 'HEAD', 'OPTIONS'], answers: 'json' },
  { path: '/.well-known/openid-configuration', methods: ['GET', 'HEAD', 'OPTIONS'], answers: 'json' },
  { path: '/.well-known/oauth-authorization-server', methods: ['GET', 'HEAD', 'OPTIONS'], answers: 'json' },
];

// oidc-provider's router compares paths with ASCII letters upper-cased (and only those: a non-ASCII
// letter never matches an ASCII one), and takes a path with one trailing slash as the path without it.
const foldAscii = (segment: string) => segment.replace(/[a-z]+/g, (letters) => letters.toUpperCase());

function segmentsOf(path: string): string[] {
  return foldAscii(path).split('/');
}

const routeSegments = providerRoutes.map((route) => ({ route, segments: segmentsOf(route.path) }));

/**
 * The route of {@link providerRoutes} that `path` (as the request has it, not decoded) reaches, if any.
 *
 * @example
 * ```ts
 * providerRouteAt('/Token/'); // the /token route
 * ```
 */
export function providerRouteAt(path: string): ProviderRoute | undefined {
  const trimmed = path.length > 1 && path.endsWith('/') ? path.slice(0, -1) : path;
  const parts = segmentsOf(trimmed);
  for (const { route, segments } of routeSegments) {
    if (segments.length !== parts.length) continue;
    // A `:param` takes any segment but an empty one, as the provider's router does.
    if (segments.every((segment, i) => (segment.startsWith(':') ? parts[i] !== '' : segment === parts[i]))) {
      return route;
    }
  }
  return undefined;
}

/**
 * A `provider.use` middleware: a request for one of the provider's paths with a method the path does
 * not take gets 405 with `Allow` (RFC 9110 section 15.5.6) instead of Koa's plain-text 404, in the
 * format of the path: an OAuth error (`invalid_request`) for the JSON endpoints, our page for the
 * others. `OPTIONS` there, when the provider leaves it unanswered (no CORS preflight), gets 204 with
 * the same `Allow`. A path that is none of the provider's gets our 404 page. The provider answers
 * every other request as before.
 *
 * @example
 * ```ts
 * provider.use(providerMethods());
 * ```
 */
export function providerMethods(): ProviderMiddleware {
  return async (koa, next) => {
    await next();
    const ctx = koa as KoaContextWithOIDC;
    // Koa's untouched default: no route of the provider answered.
    if (ctx.status !== 404 || ctx.body != null) return;
    const route = providerRouteAt(ctx.path);
    if (!route) {
      // No path of the provider's (its root, a mistyped link): our 404 page, with the headers of every
      // other page, not Koa's bare text/plain "Not Found", which carries none (no nosniff, no framing
      // rules). A HEAD gets the headers alone, as Koa sends it.
      ctx.status = 404;
      ctx.set(pageHeaders);
      ctx.body = errorPage('Page not found', 'There is no page here.');
      return;
    }
    if (route.methods.includes(ctx.method) && ctx.method !== 'OPTIONS') return;
    const allow = route.methods.includes('OPTIONS') ? route.methods : [...route.methods, 'OPTIONS'];
    ctx.set('Allow', allow.join(', '));
    if (ctx.method === 'OPTIONS') {
      ctx.status = 204;
      return;
    }
    ctx.status = 405;
    const detail = `This endpoint takes ${allow.join(', ')}.`;
    if (route.answers === 'json') {
      ctx.set('Cache-Control', 'no-store');
      ctx.body = { error: 'invalid_request', error_description: detail };
      return;
    }
    ctx.set(pageHeaders);
    ctx.body = errorPage('Method not allowed', detail);
  };
}
