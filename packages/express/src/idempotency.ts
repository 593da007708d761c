import {
  type BodyRead,
  clientLeft,
  createHttpIdempotency,
  foldRoutePath,
  type HttpIdempotencyOptions,
  type IdempotencyContext,
  isLeaseLost,
  markUnprotected,
  type ParsedBodyFields,
  principalScope,
  problemResponse,
  type ResponseCapture,
  type RoutePathOptions,
  ranUnprotected,
  readBodyForFingerprint,
  writeResponse,
} from '@idem/core';
import type { ErrorRequestHandler, NextFunction, Request, RequestHandler, Response } from 'express';

import { anonymousGuardOf, sendGuardError } from './auth-state.js';

// A `RequestHandler<any>`, so a route's params come from its path (see auth.ts).
type Middleware = RequestHandler<any>;

// On the global `Express.Request`, which every Express `Request` extends: an augmentation of
// 'express-serve-static-core' is lost where this package cannot resolve that module from its own
// folder (pnpm, npm's linked strategy, Yarn PnP), and then `req.idempotency` would not type-check.
declare global {
  namespace Express {
    interface Request {
      /** Set by `idempotency()` while a covered request executes: its key and, in transactional mode, the transaction. */
      idempotency?: IdempotencyContext;
    }
  }
}

/** Options of the Express {@link idempotency} middleware: the core's options plus the HTTP ones. */
export type ExpressIdempotencyOptions = HttpIdempotencyOptions<Request>;

/**
 * Express middleware (Express 5; it uses nothing Express 4 lacks) that makes covered requests (POST and PATCH by default) safe to
 * retry with an `Idempotency-Key`: the first request runs the handler and its response is stored, a
 * retry gets the stored response with `Idempotent-Replayed: true`, and every error is problem+json.
 *
 * Mount it after the guard (the default scope is `req.auth`) and before any body parser: it reads the
 * raw body to fingerprint it and puts the bytes back for the parser. Mounted after a parser it falls
 * back to `req.rawBody` or the parsed `req.body` (fine for JSON, which is canonicalised anyway), and
 * `maxBodyBytes` is then the parser's `limit`. Mounted on a route (`app.post('/x', idempotency(), h)`),
 * the operation is the route template; mounted with `app.use`, it is the concrete path, spelled as the
 * app's router matches it (lower case and without a trailing slash, unless the app enables
 * `case sensitive routing` or `strict routing`). A request that no route answers leaves no record:
 * the key is released. That is Express's final 404, whether no route matched or every route that
 * did passed the request on with `next()`, and, mounted with `app.use`, a not-found middleware's
 * 404 when no route matched.
 *
 * @example
 * import express from 'express';
 * import { memoryStore } from '@idem/core';
 * import { guard, idempotency } from '@idem/express';
 *
 * const app = express();
 * app.use(guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] }));
 * // Keys scoped by the tenant in the verified token, never by a header the client chose.
 * const tenantOf = (req: express.Request) => {
 *   const tenant = req.auth?.claims.tenant;
 *   return typeof tenant === 'string' ? tenant : undefined;
 * };
 * app.post('/charges', idempotency({ store: memoryStore(), scope: tenantOf }), express.json(),
 *   (req, res) => res.status(201).json({ id: 'ch_1' }));
 */
export function idempotency(options: ExpressIdempotencyOptions): Middleware {
  const http = createHttpIdempotency<Request>(options);

  const run = async (req: Request, res: Response, next: NextFunction) => {
    // An anonymous write (an optional guard let it through) has no caller to scope its key to: it is
    // answered as that guard answers a request without a token, not as a server without a scope.
    // Stacked behind another instance, this one steps aside (begin says so), whatever its scope: one
    // that claimed (its context) or ran the request unprotected (its mark).
    const stacked = req.idempotency !== undefined || ranUnprotected(req);
    const anonymous = http.scope === undefined && !stacked ? anonymousGuardOf(req) : undefined;
    if (anonymous !== undefined) {
      sendGuardError(res, anonymous.error('token_missing'));
      return;
    }
    const keyHeader = http.keyHeader(req);
    const url = req.originalUrl ?? req.url;
    const queryAt = url.indexOf('?');
    // Express sets `baseUrl` and `path`. A server that is not Express (node:http, Connect, a NestJS
    // middleware on the Fastify platform through middie) has only the URL, whose path is the operation.
    const path = typeof req.path === 'string' ? req.baseUrl + req.path : queryAt === -1 ? url : url.slice(0, queryAt);
    // Mounted with app.use, no route has matched yet: the operation is the path as the router sees it.
    const routed = req.route?.path !== undefined;
    const started = await http.begin({
      method: req.method,
      stacked,
      route: routed ? mountPath(req) + String(req.route.path) : foldRoutePath(path, routingOf(req)),
      path,
      query: queryAt === -1 ? '' : url.slice(queryAt + 1),
      contentType: req.headers['content-type'],
      keyHeader,
      acceptEncoding: req.headers['accept-encoding'],
      // Read only once the key passed (a bad key costs no body read), before the caller is checked.
      body: readBody.bind(req, http.maxBodyBytes),
      scope: http.scope ? http.scope(req) : principalScope((req as { auth?: unknown }).auth),
      headers: req.headers,
    });
    if (started.kind === 'pass') {
      // Run unprotected (fail-open): the client's key is still echoed.
      if (started.echo !== undefined) res.setHeader('Idempotency-Key', started.echo);
      if (started.unprotected) markUnprotected(req);
      next();
      return;
    }
    if (started.kind === 'respond') {
      writeResponse(res, started.response);
      return;
    }
    const { lease } = started;
    // The client left while the claim waited: no handler for nobody (see clientLeft; body-parser's
    // isFinished would hand the handler no body, and its failure would be stored).
    if (clientLeft(req, res)) {
      await http.engine.release(lease);
      return;
    }
    res.setHeader('Idempotency-Key', started.echo);
    const context: IdempotencyContext = http.context(started);
    req.idempotency = context;
    const execution: Execution = { req, res, thrown: false, capture: undefined };
    (req as Request & ExecutionState)[kExecution] = execution;
    const thrown = threw.bind(execution);
    const unrouted = answeredByNoRoute.bind(execution);
    // What a body parser's refusal, seen by idempotencyErrors(), must be about to release the key.
    const request = { headers: req.headers, body: started.body };
    if (http.transactional) {
      const capture = http.capture(res, { hold: true, unrouted, request, echo: started.echo });
      execution.capture = capture;
      res.sendFile = sendFileWatched;
      void http.runTransaction(
        lease,
        capture,
        (tx) => {
          context.tx = tx;
          next();
        },
        thrown,
      );
      return;
    }
    // Express hands a thrown error to the error handlers, whose response is captured like any
    // other; idempotencyErrors(), mounted first among them, tells the policy it was thrown.
    execution.capture = http.capture(res, { settle: { lease, thrown }, unrouted, request, echo: started.echo });
    res.sendFile = sendFileWatched;
    next();
  };

  return function idempotencyMiddleware(req, res, next) {
    if (!http.handles(req.method, req.headers['idempotency-key'])) {
      next();
      return;
    }
    run(req, res, next).catch(next);
  };
}

/**
 * How the app's router compares paths: Express routes `/charges`, `/charges/` and `/CHARGES` to one
 * handler unless the app enables `strict routing` or `case sensitive routing`.
 */
function routingOf(req: Request): RoutePathOptions {
  const app = req.app as Request['app'] | undefined;
  return {
    caseSensitive: app?.enabled('case sensitive routing') === true,
    strict: app?.enabled('strict routing') === true,
  };
}

/**
 * The path a router was mounted at, as the request spelled it (`req.baseUrl`), folded the way the
 * app matched it: `/API` and `/api` reach one router unless `case sensitive routing` is on, so a key
 * sent to both is one operation, not two executions. (Its slashes are as Express left them.)
 */
function mountPath(req: Request): string {
  return foldRoutePath(req.baseUrl, { ...routingOf(req), strict: true });
}

/**
 * True when no route answered the request, so its 404 is no outcome of the operation (see
 * `unrouted` of the capture: not stored, the key released). Either no route matched at all (the
 * middleware mounted with `app.use` claimed the key before routing; Express's final handler or a
 * not-found middleware answers), or every route that matched passed the request on with `next()`
 * and Express's final handler answers. A 404 a route's handler sends is an answer, and is stored.
 */
function answeredByNoRoute(this: Execution): boolean {
  const { req, res } = this;
  if (res.statusCode !== 404) return false;
  if (req.route === undefined) return true;
  // A route matched, so whether one answered shows only in where the end comes from. A router that
  // runs out of layers puts `req.next` back as it found it, undefined outside every router (Express
  // 4 and 5 alike): only the final handler ends a response then, never a route's handler. An error
  // passed to next() reaches the final handler too; a 404 thrown by a handler is its answer, known
  // only through idempotencyErrors(). A not-found middleware after a route that passed the request
  // on cannot be told from a route's answer (Express leaves no trace of the pass): stored.
  return req.next === undefined && !this.thrown;
}

// Shared by every request (bound to it), rather than a closure made per request.
function readBody(this: Request, maxBytes: number): Promise<BodyRead> {
  return readBodyForFingerprint(this, maxBytes, this as ParsedBodyFields);
}

/** One execution, on its request: what its capture asks when the response ends. */
interface Execution {
  readonly req: Request;
  readonly res: Response;
  thrown: boolean;
  /** The capture of its response, told of errors by idempotencyErrors(). */
  capture: ResponseCapture | undefined;
}

// Per-request state on the request itself, under a symbol no one else sees.
const kExecution = Symbol('@idem/express execution');

interface ExecutionState {
  [kExecution]?: Execution;
}

/**
 * `res.sendFile` (and `res.download`, which calls it) of an executing request. From the call on,
 * Express writes the response by itself, and it gives up in silence (ECONNABORTED) on a client that
 * left before the head went out: nothing would ever end the response, and the heartbeat would renew
 * the key's lease for as long as the process lives (409 to every retry). The capture is told that
 * the framework writes now, so a response closed before its head is settled as a file cut short.
 */
const sendFileWatched: Response['sendFile'] = function (this: Response, ...args: unknown[]): void {
  (this.req as Request & ExecutionState)[kExecution]?.capture?.handlerReturned(fileCutShort, this);
  // The app's own sendFile, on the response's prototype, under the one this request was given.
  (Object.getPrototypeOf(this) as { sendFile: (...args: unknown[]) => void }).sendFile.apply(this, args);
};

// The file was never sent: kept, by default, as a body that cannot be replayed (as a stream cut short).
function fileCutShort(res: Response, capture: ResponseCapture) {
  if (!capture.ended) capture.abandon(res.statusCode);
}

// Shared and bound to each execution, rather than a closure made per request.
function threw(this: Execution): boolean {
  return this.thrown;
}

/**
 * True for connect-timeout's error (503, `code: 'ETIMEDOUT'`, the numeric `timeout` it waited), or
 * any error on a request it marked timed out (`req.timedout`): the handler is still running.
 */
function timedOutForHandler(error: unknown, req: Request): boolean {
  if ((req as { timedout?: unknown }).timedout === true) return true;
  if (error === null || typeof error !== 'object') return false;
  const { code, timeout, status, statusCode } = error as Record<string, unknown>;
  return code === 'ETIMEDOUT' && typeof timeout === 'number' && (status ?? statusCode) === 503;
}

/**
 * Express error middleware that tells {@link idempotency} the handler threw (or called `next(error)`),
 * then passes the error on unchanged. Express gives a middleware no other way to see it, so without
 * this the outcome policy takes a thrown handler's 500 for an answer (`thrown: false`); with it,
 * `storeOutcome: 'stripe'` releases the key (where Stripe keeps the 500: the preset's one departure from
 * it), and a policy function sees `thrown: true`.
 * It also learns when a body parser mounted after the middleware (`express.json()`) refused the
 * body: no handler ran, so the parser's 400 (or 413, 415, or multer's and busboy's 500) is served
 * without being stored and the key is released, and the retry with the body fixed runs, as on Fastify. A handler that stopped on
 * its lost lease (it threw the `signal`'s reason, `lease_lost`) is answered here, 503 with
 * `Retry-After` and a problem body, as Fastify and Koa answer it; the error goes no further.
 * connect-timeout's error (503 with `code: 'ETIMEDOUT'` and a numeric `timeout`, or any error on a
 * request it marked `req.timedout`) is no failure of the handler, which still runs: the timeout's
 * answer is served but never stored, and the key is kept with `500 response_not_replayable`
 * (whatever `storeOutcome` says), so a retry never runs the handler a second time; in transactional
 * mode the transaction rolls back and the key is released instead (`503 store_unavailable`). Mount it after the routes and before your own error handlers.
 *
 * @example
 * app.use(idempotency({ store, storeOutcome: 'stripe' }));
 * app.post('/charges', createCharge);
 * app.use(idempotencyErrors());
 * app.use(myErrorHandler);
 */
export function idempotencyErrors(): ErrorRequestHandler {
  return function idempotencyErrorsMiddleware(error, req, res, next) {
    const execution = (req as Request & ExecutionState)[kExecution];
    if (execution !== undefined) {
      // connect-timeout answering for a handler that runs on: not the handler's failure, and its 503
      // is not the operation's outcome. Express never says when the handler ends, so the key is kept
      // at once with `500 response_not_replayable`, whatever the policy says of a 503 or a throw:
      // the retry is told the operation ran, and never runs it a second time.
      if (timedOutForHandler(error, req)) {
        execution.capture?.answeredForHandler();
        next(error);
        return;
      }
      execution.thrown = true;
      execution.capture?.failedWith(error);
      // A handler that stopped on its lost lease (`signal.throwIfAborted()`) did what it should: its
      // client is told to retry (503, Retry-After), as for idem's own refusals, not shown a bug.
      if (!res.headersSent && isLeaseLost(error, req.idempotency)) {
        writeResponse(res, problemResponse(error));
        return;
      }
    }
    next(error);
  };
}
