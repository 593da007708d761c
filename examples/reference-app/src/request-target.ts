import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { problemType } from '@idem/core';
import { errorPage, pageHeaders } from './html.js';

// `scheme://authority`, then the path and query as sent.
const absoluteForm = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)(.*)$/s;

/**
 * Brings an absolute-form request target (RFC 9112 §3.2.2: `GET http://host/path HTTP/1.1`, which a
 * server must accept though clients send it only to proxies) to the origin form the frameworks
 * expect, `/path?query` as sent. The frameworks read such a target each their own way: Koa builds
 * URLs from it (oidc-provider hands out ones on whatever host it names) and its `ctx.path` throws for
 * an authority that does not parse, and Express builds a URL from it that throws. False, the target
 * left as it is, when its authority does not parse: the request is the client's error, 400.
 *
 * @example
 * ```ts
 * toOriginForm(req); // req.url 'http://localhost:8083/callback?code=x' becomes '/callback?code=x'
 * ```
 */
export function toOriginForm(req: IncomingMessage): boolean {
  const target = req.url ?? '/';
  if (target.startsWith('/') || target === '*') return true;
  const parts = absoluteForm.exec(target);
  if (parts === null || !URL.canParse(`${parts[1]}://${parts[2]}/`)) return false;
  req.url = originFormOf(parts[3] ?? '');
  return true;
}

/**
 * Brings an absolute-form request target that names one of `origins` (the server's own, as
 * `URL.origin` writes them) to the origin form, and makes its authority the Host header: RFC 9112
 * §3.2.2, a server MUST accept the absolute form, whose authority replaces Host. A client configured
 * with the server as its forward proxy sends it. Any other target is left as sent, for the server to
 * refuse: one naming another origin (another host, port or scheme), one with user info in its
 * authority, one that does not parse. A server that is no proxy serves no other origin's targets.
 *
 * @example
 * ```ts
 * toOwnOriginForm(req, new Set(['http://localhost:8080']));
 * // req.url 'http://localhost:8080/photos' becomes '/photos', Host 'localhost:8080';
 * // 'http://evil.example/photos' stays as it is
 * ```
 */
export function toOwnOriginForm(req: IncomingMessage, origins: ReadonlySet<string>): void {
  const target = req.url ?? '/';
  if (target.startsWith('/')) return;
  const parts = absoluteForm.exec(target);
  // User info has no place in an http(s) target (RFC 9110 §4.2.4): such a target is refused, not read.
  if (parts === null || parts[2]?.includes('@')) return;
  const authority = URL.parse(`${parts[1]}://${parts[2]}/`);
  if (authority === null || !origins.has(authority.origin)) return;
  req.url = originFormOf(parts[3] ?? '');
  req.headers.host = authority.host;
}

// The path and query after an absolute-form target's authority, as sent: `/` when it has no path.
const originFormOf = (rest: string) => (rest.startsWith('/') ? rest : `/${rest}`);

/** How a service answers a target {@link toOriginForm} cannot take: a problem document, or a page. */
export type BadTargetAnswer = 'problem' | 'page';

/**
 * `handler` behind {@link toOriginForm}: a target it cannot bring to the origin form is answered 400
 * here, before any framework sees it: a problem document (`path_malformed`, the gateway's and the
 * API's code for a path that does not parse) from the services that answer in JSON, an error page
 * with the pages' headers from those a browser visits.
 *
 * @example
 * ```ts
 * const server = createServer(withOriginForm(app.callback(), 'problem'));
 * ```
 */
export function withOriginForm(handler: RequestListener, answer: BadTargetAnswer): RequestListener {
  return (req: IncomingMessage, res: ServerResponse) => {
    if (toOriginForm(req)) {
      handler(req, res);
      return;
    }
    if (answer === 'page') {
      res
        .writeHead(400, pageHeaders)
        .end(errorPage('Bad request', 'The address of this request names a host that does not parse.'));
      return;
    }
    const problem = {
      type: problemType('path_malformed'),
      title: 'The request path is not valid',
      status: 400,
      detail: 'The request target names a host that does not parse.',
      code: 'path_malformed',
    };
    res
      .writeHead(400, { 'Content-Type': 'application/problem+json', 'Cache-Control': 'no-store' })
      .end(JSON.stringify(problem));
  };
}
