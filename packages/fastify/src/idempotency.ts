import { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import {
  clientLeft,
  connectionSpecificField,
  createHttpIdempotency,
  decodeRequestBody,
  type HttpBeginResult,
  type HttpIdempotency,
  type HttpIdempotencyOptions,
  type HttpResponse,
  headerRecord,
  type IdempotencyContext,
  isJsonContentType,
  isLeaseLost,
  jsonBodyText,
  originForm,
  parsedBodyRead,
  principalScope,
  problemResponse,
  type ResponseCapture,
  type RouteOverrides,
  readRequestBody,
  readStream,
  writeResponse,
} from '@idem/core';
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest, RouteHandlerMethod } from 'fastify';
import fp from 'fastify-plugin';
import { anonymousGuardOf, sendGuardError } from './auth-state.js';

/**
 * The plugin options a route may set for itself in `config.idempotency`: how long its outcomes are
 * kept and which are stored, its lease and wait, its limits and replayed headers, its fingerprint,
 * and whether it runs unprotected when the store is down (`storeUnavailable`).
 * What ties records together (`store`, `transactional`, `methods`, `onEvent`, `now`) stays the plugin's.
 */
export const routeSettingNames = [
  'retention',
  'acknowledgeShortRetention',
  'lease',
  'maxExecution',
  'wait',
  'storeOutcome',
  'mismatchStatus',
  'maxBodyBytes',
  'maxResponseBytes',
  'replayHeaders',
  'strictKeys',
  'fingerprint',
  'advertiseExpiry',
  'storeUnavailable',
] as const;

type RouteSettings = Pick<FastifyIdempotencyOptions, (typeof routeSettingNames)[number]>;

/** Per-route settings in the route's `config.idempotency`; `false` turns the plugin off for that route. */
export interface RouteIdempotencyOptions extends RouteSettings {
  required?: boolean | undefined;
  mintKeys?: boolean | undefined;
  /** The caller for this route's records; overrides the plugin's `scope`. */
  scope?: ((request: FastifyRequest) => string | undefined) | undefined;
}

const routeOptionNames: ReadonlySet<string> = new Set([...routeSettingNames, 'required', 'mintKeys', 'scope']);

declare module 'fastify' {
  interface FastifyRequest {
    /** Set while a covered request executes: its key and, in transactional mode, the transaction. */
    idempotency?: IdempotencyContext;
  }
  interface FastifyContextConfig {
    /** Per-route idempotency settings, or `false` to leave the route alone. */
    idempotency?: RouteIdempotencyOptions | false;
  }
}

/** Options of the Fastify {@link idempotency} plugin: the core's options plus the HTTP ones. */
export type FastifyIdempotencyOptions = HttpIdempotencyOptions<FastifyRequest>;

interface Execution {
  thrown: boolean;
  /** The capture of its response, told of the error the handler threw (see the `onError` hook). */
  capture: ResponseCapture | undefined;
}

/**
 * Wraps a route's handler so the capture learns when an async handler returned nothing without
 * sending. Fastify then sends for it (the status set, no body), but not to a client that has left:
 * nothing would ever end the response, and the heartbeat would renew the key's lease for as long as
 * the process lives (409 to every retry). The capture settles it from the reply instead, as that
 * send would have. A handler that returns a value, or the reply (it sends later), or hijacks it, is
 * left to Fastify. (Routes added before the plugin are not wrapped: register it first.)
 */
function watchReturn(handler: RouteHandlerMethod): RouteHandlerMethod {
  return function watched(this: FastifyInstance, request, reply) {
    let result: unknown;
    try {
      result = handler.call(this, request, reply);
    } catch (error) {
      if (answeredLeaseLost(request, reply, error)) return reply;
      throw error;
    }
    const capture = stateOf(request)[kExecution]?.capture;
    if (capture !== undefined && typeof (result as PromiseLike<unknown> | undefined)?.then === 'function') {
      return (result as PromiseLike<unknown>).then(
        (payload) => {
          if (payload === undefined && !reply.sent) capture.handlerReturned(settleUnsent, reply);
          return payload;
        },
        (error: unknown) => {
          if (answeredLeaseLost(request, reply, error)) return reply;
          throw error;
        },
      );
    }
    return result;
  } as RouteHandlerMethod;
}

// A handler that stopped on its lost lease (`signal.throwIfAborted()`) did what it should: its client
// is told to retry (503, Retry-After), as for idem's own refusals, instead of Fastify's error handler
// answering a bug. True when so answered.
function answeredLeaseLost(request: FastifyRequest, reply: FastifyReply, error: unknown): boolean {
  const execution = stateOf(request)[kExecution];
  if (execution === undefined || reply.sent || !isLeaseLost(error, request.idempotency)) return false;
  execution.thrown = true;
  execution.capture?.failedWith(error);
  answer(reply, problemResponse(error));
  return true;
}

// What Fastify sends for an async handler's undefined: the status and headers set, an empty body,
// and the reason phrase Node's head would carry (the capture takes it from `reply.raw`).
function settleUnsent(reply: FastifyReply, capture: ResponseCapture) {
  if (capture.ended) return;
  capture.completeAsWritten({
    status: reply.statusCode,
    headers: headerRecord(reply.getHeaders()),
    body: Buffer.alloc(0),
  });
}

// How Fastify's parser fails on a body that never arrived whole: Node's 'aborted' error of a request
// whose connection closed mid-body, or fewer bytes than its Content-Length at the stream's end.
function cutShort(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'ECONNRESET' || code === 'FST_ERR_CTP_INVALID_CONTENT_LENGTH';
}

// Shared and bound to each execution, rather than a closure made per request.
function threw(this: Execution): boolean {
  return this.thrown;
}

// Per-request state lives on the request itself, under symbols no one else sees. (A WeakMap entry
// per request is an ephemeron that every young-generation GC has to trace: it cost more than the rest
// of the plugin's bookkeeping.)
const kBody = Symbol('@idem/fastify body');
const kFromParsed = Symbol('@idem/fastify from parsed body');
const kSnapshot = Symbol('@idem/fastify body snapshot');
const kExecution = Symbol('@idem/fastify execution');
const kRoute = Symbol('@idem/fastify route');
const kOwner = Symbol('@idem/fastify owner');
const kConstraints = Symbol('@idem/fastify route constraints');

/** What the plugin needs of a request's route, worked out once per request. */
interface RouteInfo {
  config: RouteIdempotencyOptions | false;
  overrides: RouteOverrides;
  /** The route template, e.g. `/charges/:id`. */
  url: string | undefined;
  /** The route validates its body: with Fastify's default AJV options that may change `request.body`. */
  validatesBody: boolean;
}

interface RequestState {
  [kBody]?: Buffer;
  /** The body is fingerprinted from what Fastify's parser made of it (see preParsing). */
  [kFromParsed]?: boolean;
  /** A copy of the parsed body taken before validation could change it. */
  [kSnapshot]?: unknown;
  [kExecution]?: Execution;
  [kRoute]?: RouteInfo;
  /**
   * The instance that took the request in preParsing. Where two registrations reach one route (one
   * at the root, one in the route's context), only the first reads the body and enforces its limits;
   * the other steps aside in every hook (see `stacked`).
   */
  [kOwner]?: object;
}

const stateOf = (request: FastifyRequest) => request as FastifyRequest & RequestState;

// Most routes override nothing: they share one empty object instead of building one per request.
const noOverrides: RouteOverrides = Object.freeze({});
// The setting of a route with no `config.idempotency`: one shared object, so the plugin's own
// instance is found without a lookup.
const noSettings: RouteIdempotencyOptions = Object.freeze({});
const noRoute: RouteInfo = Object.freeze({
  config: false,
  overrides: noOverrides,
  url: undefined,
  validatesBody: false,
});

// Both hooks need the route: it is worked out in the first and kept on the request, since Fastify's
// `request.routeOptions` builds a new object of a dozen fields on every read.
function routeOf(request: FastifyRequest): RouteInfo {
  const state = stateOf(request);
  const known = state[kRoute];
  if (known !== undefined) return known;
  let info = noRoute;
  // No route matched: nothing would execute, so there is nothing to make idempotent (and a 404
  // must not be stored as the outcome of a route deployed later).
  if (!request.is404) {
    const options = request.routeOptions;
    const setting = (options?.config as { idempotency?: RouteIdempotencyOptions | false } | undefined)?.idempotency;
    const config = setting === undefined ? noSettings : setting;
    info = {
      config,
      overrides: config === false ? noOverrides : overridesOf(config),
      url: withConstraints(options?.url, (options?.config as { [kConstraints]?: string } | undefined)?.[kConstraints]),
      validatesBody: (options?.schema as { body?: unknown } | undefined)?.body !== undefined,
    };
  }
  state[kRoute] = info;
  return info;
}

// Routes on one method and URL that differ in their constraints (`constraints: { host }` for a
// tenant's subdomain, `{ version }` for an API version) are different endpoints with different
// handlers. Fastify keeps the matched route's constraints nowhere on the request, so `onRoute`
// notes them in the route's config, and they become part of its operation: `/charges [host:
// a.example]`. Without them, a key sent to b.example would replay a.example's response.
function withConstraints(url: string | undefined, constraints: string | undefined): string | undefined {
  return url === undefined || constraints === undefined ? url : `${url} [${constraints}]`;
}

function describeConstraints(constraints: unknown): string | undefined {
  if (constraints === null || typeof constraints !== 'object') return undefined;
  const names = Object.keys(constraints).sort();
  if (names.length === 0) return undefined;
  return names
    .map((name) => {
      const value = (constraints as Record<string, unknown>)[name];
      // A host may be a RegExp; a custom strategy's value may be anything its matcher takes.
      const text = typeof value === 'string' || value instanceof RegExp ? String(value) : JSON.stringify(value);
      return `${name}: ${text}`;
    })
    .join(', ');
}

// A typo in a route's settings (`retension`) or a setting only the plugin has (`store`) would be
// ignored in silence: it is refused when the route is added instead.
function checkRouteOptions(config: unknown): asserts config is RouteIdempotencyOptions {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) {
    throw new TypeError('config.idempotency must be false or an object of per-route settings');
  }
  for (const name of Object.keys(config)) {
    if (!routeOptionNames.has(name)) {
      throw new TypeError(
        `config.idempotency.${name} is not a per-route setting; a route may set ${[...routeOptionNames].join(', ')}`,
      );
    }
  }
  // The other settings are checked by the instance built from them; these three are the hooks' own.
  const { required, mintKeys, scope } = config as RouteIdempotencyOptions;
  if (required !== undefined && typeof required !== 'boolean') {
    throw new TypeError('config.idempotency.required must be a boolean');
  }
  if (mintKeys !== undefined && typeof mintKeys !== 'boolean') {
    throw new TypeError('config.idempotency.mintKeys must be a boolean');
  }
  if (scope !== undefined && typeof scope !== 'function') {
    throw new TypeError('config.idempotency.scope must be a function of the request returning the caller');
  }
}

function overridesOf(route: RouteIdempotencyOptions): RouteOverrides {
  if (route.required === undefined && route.mintKeys === undefined) return noOverrides;
  return {
    ...(route.required === undefined ? {} : { required: route.required }),
    ...(route.mintKeys === undefined ? {} : { mintKeys: route.mintKeys }),
  };
}

// Answers without Fastify's serialisation, so problems and replays are the same bytes in every
// adapter. Headers earlier hooks set on the reply (CORS, security headers) are kept, as Express and
// Koa keep what earlier middleware set on the response: they are put on the raw response, where a
// list (two cookies) stays one header line each, and the answer's own headers take precedence.
function answer(reply: FastifyReply, response: HttpResponse) {
  const set = reply.getHeaders();
  const raw = reply.raw;
  // Over HTTP/2, a field an earlier hook set about the connection (`keep-alive`, ...) is left out.
  const h2 = reply.request.raw.httpVersionMajor === 2;
  reply.hijack();
  try {
    for (const name in set) {
      const value = set[name];
      if (value !== undefined && !(h2 && connectionSpecificField(name))) raw.setHeader(name, value);
    }
    writeResponse(raw, response);
  } catch (error) {
    // A header an earlier hook set that Node will not write (over HTTP/2, a connection-specific one):
    // thrown here, inside a promise callback, it would end the process. This answer is given up.
    raw.destroy(error as Error);
  }
}

// The body, read by the plugin, handed on to Fastify's parser as a stream of the same bytes. A plain
// Readable with the bytes pushed at once: Readable.from would add an async iterator and a promise
// per chunk. `receivedEncodedLength` is what Fastify checks against Content-Length and bodyLimit:
// the bytes that came off the wire, as the stream it replaces reported them (a decompressing hook
// reports the encoded length, as Fastify asks), else the bytes read.
function bodyStream(body: Buffer, received: Readable): Readable & { receivedEncodedLength?: number } {
  const stream: Readable & { receivedEncodedLength?: number } = new Readable({ read: noRead });
  if (body.length > 0) stream.push(body);
  stream.push(null);
  const encoded = (received as { receivedEncodedLength?: unknown }).receivedEncodedLength;
  stream.receivedEncodedLength = typeof encoded === 'number' ? encoded : body.length;
  return stream;
}

// The parsed body as JSON bytes, fixed before validation can change it: they fingerprint exactly as
// the parsed value would (see jsonBodyText).
function snapshot(body: object): Buffer {
  return Buffer.from(jsonBodyText(body));
}

function noRead() {
  // Everything was pushed when the stream was made.
}

// The path of an origin-form target, without its query.
function pathOf(url: string, queryAt = url.indexOf('?')): string {
  return queryAt === -1 ? url : url.slice(0, queryAt);
}

const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (fastify, registered) => {
  // Fastify hands its own register options (`prefix`, `logLevel`, `logSerializers`) to the plugin
  // too; the core refuses names it does not know.
  const { prefix, logLevel, logSerializers, ...options } = registered as FastifyIdempotencyOptions &
    Record<'prefix' | 'logLevel' | 'logSerializers', unknown>;
  const http = createHttpIdempotency<FastifyRequest>(options);
  // A route that sets options of its own (a longer retention, its own outcome policy) runs on an
  // instance of its own: the plugin's options with the route's on top, on the same store. It is
  // built when the route is added, so a bad setting fails at startup, and found by the route's
  // config object afterwards.
  const routeInstances = new WeakMap<RouteIdempotencyOptions, HttpIdempotency<FastifyRequest> | Error>();
  const build = (config: RouteIdempotencyOptions): HttpIdempotency<FastifyRequest> => {
    checkRouteOptions(config);
    const own: Partial<RouteSettings> = {};
    for (const name of routeSettingNames) {
      if (config[name] !== undefined) (own as Record<string, unknown>)[name] = config[name];
    }
    return Object.keys(own).length === 0 ? http : createHttpIdempotency<FastifyRequest>({ ...options, ...own });
  };
  fastify.addHook('onRoute', (route) => {
    route.handler = watchReturn(route.handler);
    const constraints = describeConstraints(route.constraints);
    if (constraints !== undefined)
      route.config = { ...route.config, [kConstraints]: constraints } as typeof route.config;
    const setting = (route.config as { idempotency?: unknown } | undefined)?.idempotency;
    if (setting === undefined || setting === false) return;
    if (!routeInstances.has(setting as RouteIdempotencyOptions)) {
      routeInstances.set(setting as RouteIdempotencyOptions, build(setting as RouteIdempotencyOptions));
    }
  });
  // A route added before the plugin was never seen by `onRoute`: its instance is built on its first
  // request. Bad settings cannot fail the startup then; they are reported once, as a process warning
  // with the reason, and the route's requests fail with a plain 500 (the reason is not the client's
  // to read), never run without the idempotency they asked for.
  const instanceOf = (config: RouteIdempotencyOptions | false): HttpIdempotency<FastifyRequest> | Error => {
    if (config === false || config === noSettings) return http;
    let instance = routeInstances.get(config);
    if (instance === undefined) {
      try {
        instance = build(config);
      } catch (error) {
        process.emitWarning(
          `A route's config.idempotency was refused: ${(error as Error).message}. Register the plugin before its routes, so that bad settings fail at startup.`,
          { code: 'IDEM_ROUTE_SETTINGS' },
        );
        instance = Object.assign(new Error('The idempotency settings of this route are invalid.'), { statusCode: 500 });
      }
      routeInstances.set(config, instance);
    }
    return instance;
  };
  // With `onProtoPoisoning` or `onConstructorPoisoning` set to 'remove', Fastify's parser drops keys
  // the client sent: the parsed value is then not what the bytes say, and fingerprinting it would
  // make a body sent with a length and the same body sent chunked (read raw) two requests.
  const { onProtoPoisoning, onConstructorPoisoning } = fastify.initialConfig;
  const parsedIsBytes = onProtoPoisoning !== 'remove' && onConstructorPoisoning !== 'remove';

  // The raw body is read here, before Fastify's own parser, which then reads the same bytes:
  // parsers and bodyLimit behave exactly as without the plugin. A JSON body is fingerprinted from
  // the value Fastify's parser made of it, however it was framed: that gives the fingerprint of its
  // bytes (both are canonicalised), and a parser that changes values (a custom one) changes them
  // alike for a body sent with a length and the same body sent chunked, so the two stay one
  // request. Of declared length, it is left to the parser without being read here at all.
  // (A callback hook: the JSON path answers without a promise per request.)
  fastify.addHook('preParsing', (request, reply, payload, done) => {
    const { config: route, overrides, url: template } = routeOf(request);
    if (route === false) return done(null, payload);
    const own = instanceOf(route);
    if (own instanceof Error) return done(own, payload);
    const keyHeader = own.keyHeader(request.raw);
    if (!own.handles(request.method, keyHeader, overrides)) return done(null, payload);
    // A bad key is answered in preHandler without idem reading the body (400 before idem's 413).
    // Fastify's own parser still reads it first, and its `bodyLimit` answers before we do.
    if (own.refusesKey(keyHeader, overrides)) return done(null, payload);
    const owner = stateOf(request)[kOwner];
    if (owner !== undefined && owner !== http) return done(null, payload);
    stateOf(request)[kOwner] = http;
    const headers = request.headers;
    const declared = Number(headers['content-length']);
    const json = parsedIsBytes && isJsonContentType(headers['content-type']);
    // With a declared length Fastify's parser reads exactly that many bytes or fails the request, so
    // nothing over the limit gets through; a body over it, or chunked, takes the reading path below,
    // which enforces maxBodyBytes.
    if (json && payload === request.raw && declared > 0 && declared <= own.maxBodyBytes) {
      stateOf(request)[kFromParsed] = true;
      return done(null, payload);
    }
    // The request itself (no earlier hook replaced it) is read and its bytes put back with
    // `unshift`, so Fastify's parser reads them from the request as usual; another hook's stream is
    // read to its end and handed on as a fresh stream of the same bytes.
    // (Only a real IncomingMessage: an injected request, as in `app.inject`, has no `complete`.)
    const raw = payload === request.raw && payload instanceof IncomingMessage;
    const reading = raw
      ? readRequestBody(request.raw, own.maxBodyBytes)
      : readStream(payload, own.maxBodyBytes, headers['content-length']);
    reading.then((read) => {
      // A compressed body is fingerprinted by what it says, as the Express and Koa adapters do: the
      // same form gzipped twice (gzip writes a timestamp) is one request. The encoded bytes go on to
      // Fastify, whose hooks (@fastify/compress) decode them after this one.
      const result =
        read.ok && !json
          ? decodeRequestBody(read.body ?? Buffer.alloc(0), headers['content-encoding'], own.maxBodyBytes)
          : read;
      if (!result.ok) {
        const route = template ?? pathOf(originForm(request.url));
        answer(reply, own.refuse(result.error, { method: request.method, route }));
        return done(null, payload);
      }
      // The bytes as read (`result` is `read` itself, or what they decode to).
      const body = (read.ok ? read.body : undefined) ?? Buffer.alloc(0);
      if (json) stateOf(request)[kFromParsed] = true;
      else stateOf(request)[kBody] = result.body ?? body;
      // An empty body (chunked, `0\r\n\r\n` alone) had nothing to put back, so nothing cancelled
      // the request's 'end', which came before Fastify's parser listened: it waited for ever.
      done(null, raw && body.length > 0 ? payload : bodyStream(body, payload));
    }, done);
  });

  // Validation with Fastify's default AJV options removes unknown fields, fills in defaults and
  // coerces types in `request.body`: the fingerprint is of what the client sent, so a route with a
  // body schema keeps a copy of the parsed body from before. (Hooks run in the order they were
  // added: one added before this plugin has seen the body first, as it would see the raw stream.)
  // (A callback hook: every covered request passes here, and Fastify runs it without a promise.)
  fastify.addHook('preValidation', (request, _reply, done) => {
    const state = stateOf(request);
    if (state[kFromParsed] === true && state[kOwner] === http && routeOf(request).validatesBody) {
      const body = request.body;
      try {
        state[kSnapshot] =
          body !== null && typeof body === 'object' && !(body instanceof Uint8Array) ? snapshot(body) : body;
      } catch (error) {
        // What a custom parser made and JSON cannot write (a cycle): an error, as the fingerprint
        // would have raised it after validation.
        done(error as Error);
        return;
      }
    }
    done();
  });

  // (A callback hook, like the others: Fastify then makes no promise of its own per request.) To
  // answer early it does not call `done`: the reply is hijacked and written, and the handler never runs.
  fastify.addHook('preHandler', (request, reply, done) => {
    // This plugin's own execution, met again: a handler's `reply.callNotFound()` runs the not-found
    // context's preHandler hooks on the same request. Its 404 is the handler's answer, already
    // captured; it is not a second registration (IDEM_STACKED).
    if (stateOf(request)[kExecution] !== undefined && stateOf(request)[kOwner] === http) return done();
    const { config: route, overrides, url: template } = routeOf(request);
    if (route === false) {
      if (request.is404) keepNotFoundFromCaches(request, reply);
      return done();
    }
    const own = instanceOf(route);
    if (own instanceof Error) return done(own);
    const keyHeader = own.keyHeader(request.raw);
    if (!own.handles(request.method, keyHeader, overrides)) return done();
    const url = originForm(request.url);
    const queryAt = url.indexOf('?');
    const path = pathOf(url, queryAt);
    const scope = route.scope ?? own.scope;
    const state = stateOf(request);
    const stacked = request.idempotency !== undefined || (state[kOwner] !== undefined && state[kOwner] !== http);
    // An anonymous write (an optional guard let it through) has no caller to scope its key to: it is
    // answered as that guard answers a request without a token, not as a server without a scope.
    // Stacked behind another registration, this one steps aside (begin says so), whatever its scope.
    const anonymous = scope === undefined && !stacked ? anonymousGuardOf(request) : undefined;
    if (anonymous !== undefined) {
      sendGuardError(reply, anonymous.error('token_missing'));
      return;
    }
    let body: Buffer | Uint8Array | undefined = state[kBody];
    let json: unknown;
    if (state[kFromParsed] === true) {
      const parsed = parsedBodyRead(
        { body: kSnapshot in state ? state[kSnapshot] : request.body },
        request.headers['content-type'],
      );
      body = parsed.body;
      json = parsed.json;
    }
    own
      .begin(
        {
          method: request.method,
          stacked,
          route: template ?? path,
          path,
          query: queryAt === -1 ? '' : url.slice(queryAt + 1),
          contentType: request.headers['content-type'],
          keyHeader,
          acceptEncoding: request.headers['accept-encoding'],
          body: body !== undefined && body.length > 0 ? body : undefined,
          json,
          scope: scope ? scope(request) : principalScope((request as { auth?: unknown }).auth),
          headers: request.headers,
        },
        overrides,
      )
      .then((started) => begun(own, request, reply, started, done), done);
  });

  // A keyed request no route took: Express and Koa claim its key before any route is looked for (and
  // release it), so their capture marks the 404 `Cache-Control: no-store`; Fastify knows first and
  // claims nothing. The answer is still one to a keyed write, which a shared cache must not keep (the
  // route may exist on the next instance a moment later): marked alike here, before the not-found
  // handler runs, so one that sets its own Cache-Control still wins. A request the plugin would not
  // cover (a GET, a POST without a key where none is required) is left as Fastify answers it.
  function keepNotFoundFromCaches(request: FastifyRequest, reply: FastifyReply) {
    if (!http.handles(request.method, http.keyHeader(request.raw))) return;
    if (!reply.hasHeader('cache-control')) reply.header('cache-control', 'no-store');
  }

  // An error before the key was claimed (Fastify's parser or bodyLimit, a schema's validation), on a
  // request this plugin covers. Express and Koa claim the key before their parser runs, so the
  // capture already says `Cache-Control: no-store` on such an answer: it gets the same here, unless
  // an earlier hook set its own. And a JSON body of declared length cut short (the client hung up,
  // or Node's request timeout cut it) was left to Fastify's parser, which fails on it: reported as
  // the `refused` event (`body_incomplete`) that Express and Koa report, having read it themselves.
  function refusedBeforeClaim(request: FastifyRequest, reply: FastifyReply, error: unknown) {
    const { config: route, overrides, url: template } = routeOf(request);
    if (route === false) {
      // Fastify's parser reads the body of a not-found request too, and may refuse it first.
      if (request.is404) keepNotFoundFromCaches(request, reply);
      return;
    }
    const own = instanceOf(route);
    if (own instanceof Error || !own.handles(request.method, own.keyHeader(request.raw), overrides)) return;
    if (!reply.hasHeader('cache-control')) reply.header('cache-control', 'no-store');
    const state = stateOf(request);
    if (state[kOwner] === http && state[kFromParsed] === true && !request.raw.complete && cutShort(error)) {
      own.refuseIncompleteBody({ method: request.method, route: template ?? pathOf(originForm(request.url)) });
    }
  }

  function begun(
    own: HttpIdempotency<FastifyRequest>,
    request: FastifyRequest,
    reply: FastifyReply,
    started: HttpBeginResult,
    done: () => void,
  ) {
    if (started.kind === 'pass') {
      // Run unprotected (fail-open): the client's key is still echoed.
      if (started.echo !== undefined) echoKey(reply, started.echo);
      return done();
    }
    if (started.kind === 'respond') return answer(reply, started.response);
    const { lease } = started;
    // The client left while the claim waited: no handler for nobody (see clientLeft).
    if (clientLeft(request.raw, reply.raw)) {
      reply.hijack();
      void own.engine.release(lease);
      return;
    }
    echoKey(reply, started.echo);
    const context: IdempotencyContext = own.context(started);
    request.idempotency = context;
    const execution: Execution = { thrown: false, capture: undefined };
    stateOf(request)[kExecution] = execution;
    // What a refusal of the body, thrown where the handler reads it, must be about to release the key.
    const facts = { headers: request.headers, body: started.body };
    if (!own.transactional) {
      execution.capture = own.capture(reply.raw, {
        settle: { lease, thrown: threw.bind(execution) },
        request: facts,
        echo: started.echo,
      });
      return done();
    }
    const capture = own.capture(reply.raw, { hold: true, request: facts, echo: started.echo });
    execution.capture = capture;
    // The handler must run inside the transaction: Fastify is let on to the handler only from
    // within the transaction's callback.
    void own.runTransaction(
      lease,
      capture,
      (tx) => {
        context.tx = tx;
        done();
      },
      threw.bind(execution),
      // The transaction never started: the 503 is written, Fastify must not answer too.
      () => reply.hijack(),
    );
  }

  // Runs before the error response is sent, so the policy knows the handler threw. A body Fastify's
  // parser refuses never gets here (it answers before the key is claimed, as does @fastify/multipart
  // with `attachFieldsToBody`), but an upload the handler reads itself (`request.file()`,
  // `request.parts()`, `request.saveRequestFiles()`) is refused where it reads it: the same bytes
  // fail the same way on every retry, so that refusal is no outcome either. It is served without the
  // key's echo and not stored, and the key is released, so the retry with the upload fixed runs.
  fastify.addHook('onError', async (request, reply, error) => {
    const execution = stateOf(request)[kExecution];
    if (execution === undefined) {
      refusedBeforeClaim(request, reply, error);
      return;
    }
    // Fastify's own `handlerTimeout` answering for a handler that runs on: as for a timer of the
    // app's that says `answeringForHandler()`, its 503 is no outcome of the operation (Express's
    // connect-timeout and Koa's koa-timeout are taken alike). The handler did not throw.
    if ((error as { code?: unknown } | null)?.code === 'FST_ERR_HANDLER_TIMEOUT') {
      execution.capture?.answeredForHandler();
      return;
    }
    execution.thrown = true;
    if (execution.capture?.failedWith(error)) {
      reply.removeHeader('idempotency-key');
      if (!reply.raw.headersSent) reply.raw.removeHeader('idempotency-key');
    }
  });
};

/**
 * Fastify 5 plugin that makes covered requests (POST and PATCH by default) safe to retry with an
 * `Idempotency-Key`. It applies to every route of the instance it is registered on (it is wrapped
 * with fastify-plugin); a route opts out in its `config.idempotency`, or sets `required`, `mintKeys`,
 * `scope` and the settings of {@link routeSettingNames} (its own `retention`, `storeOutcome`, ...) there. Register it after the guard, whose principal (`request.auth`) is the default scope.
 *
 * The raw body is read in a `preParsing` hook and handed back to Fastify's parser unchanged; the key
 * is claimed in `preHandler`; every response (objects, strings, buffers, streams, even hijacked
 * replies) is captured where Fastify writes it.
 *
 * @example
 * import Fastify from 'fastify';
 * import { memoryStore } from '@idem/core';
 * import { idempotency } from '@idem/fastify';
 *
 * const app = Fastify();
 * // No guard here, so `scope` says who is calling: everyone is 'demo'. A real app registers the
 * // guard first and drops `scope`, so each key is scoped by the authenticated caller.
 * await app.register(idempotency, { store: memoryStore(), scope: () => 'demo' });
 * app.post('/charges', async (request, reply) => reply.code(201).send({ id: 'ch_1' }));
 * app.post('/webhooks', { config: { idempotency: false } }, async () => ({ ok: true }));
 */
export const idempotency = fp(plugin, { fastify: '5.x', name: '@idem/fastify' });

// The `Idempotency-Key` response header, on the raw response too: Fastify sends its reply's headers
// only when it sends the reply, and a hijacked one (server-sent events, raw writes) would go out
// without the key, a minted one lost.
function echoKey(reply: FastifyReply, key: string): void {
  reply.header('idempotency-key', key);
  reply.raw.setHeader('idempotency-key', key);
}
