import type { Express, NextFunction, Request, RequestHandler, Response, Router } from 'express';

// The parts of Express 5's router (the `router` package) read here. They are not typed by
// @types/express; methods.test.ts fails if an upgrade moves them.
interface RouterLayer {
  route?: { methods: Record<string, boolean> };
  handle: unknown;
  match(path: string): false | { path: string };
}

function layersOf(handle: unknown): readonly RouterLayer[] | undefined {
  const stack = (handle as { stack?: unknown } | null | undefined)?.stack;
  return Array.isArray(stack) ? (stack as RouterLayer[]) : undefined;
}

/** The methods of the routes in `layers` that match `path`, into `into`; nested routers count too. */
function collect(layers: readonly RouterLayer[], path: string, into: Set<string>): void {
  for (const layer of layers) {
    const matched = layer.match(path);
    if (!matched) continue;
    if (layer.route) {
      for (const [method, takes] of Object.entries(layer.route.methods)) {
        // `_all` is a route that takes every method: nothing to refuse at this path.
        if (takes) into.add(method === '_all' ? '*' : method.toUpperCase());
      }
      continue;
    }
    const nested = layersOf(layer.handle);
    if (nested) collect(nested, path.slice(matched.path.length) || '/', into);
  }
}

/**
 * The methods that the routes of `app` (an Express app or a router) take at `path` (`GET` brings `HEAD`, as Express answers HEAD with a
 * GET route), sorted; empty when no route has this path, and `['*']` when one takes every method.
 *
 * @example
 * ```ts
 * routeMethodsAt(app, '/charges'); // ['POST']
 * ```
 */
export function routeMethodsAt(app: Express | Router, path: string): string[] {
  // A router holds its stack itself; an app holds it in its router.
  const layers = layersOf(app) ?? layersOf((app as unknown as { router: unknown }).router);
  const methods = new Set<string>();
  try {
    if (layers) collect(layers, path, methods);
  } catch {
    // A parameter that does not percent-decode: the router refuses it before any route; no route here.
    return [];
  }
  if (methods.has('*')) return ['*'];
  if (methods.has('GET')) methods.add('HEAD');
  return [...methods].sort();
}

/** Writes the refusal of a method the path's routes do not take; `allow` is already in the `Allow` header. */
export type MethodRefusal = (req: Request, res: Response, allow: readonly string[]) => void;

/**
 * The last middleware of an Express app (before its 404), or of a router: a request whose path some route serves, but
 * with another method, gets 405 with the `Allow` header RFC 9110 section 15.5.6 requires, written by
 * `refuse` in the app's own format; `OPTIONS` there gets 204 with the same `Allow`. Any other request
 * goes on to the 404. The routes are read from the app itself, so the answer cannot drift from them.
 * A router must hold it itself: Express answers `OPTIONS` at the end of a router on its own (200 and
 * a text body), before an app-level middleware after it would run.
 *
 * @example
 * ```ts
 * app.use(methodNotAllowed(app, (_req, res) => sendProblem(res, 'method_not_allowed', 'See Allow.')));
 * app.use(notFound);
 * ```
 */
export function methodNotAllowed(app: Express | Router, refuse: MethodRefusal): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    const methods = routeMethodsAt(app, req.path);
    if (methods.length === 0 || methods.includes('*') || methods.includes(req.method)) {
      next();
      return;
    }
    const allow = [...methods, 'OPTIONS'];
    res.setHeader('Allow', allow.join(', '));
    if (req.method === 'OPTIONS') {
      res.status(204).end();
      return;
    }
    refuse(req, res, allow);
  };
}
