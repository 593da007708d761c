import { createServer, type Server } from 'node:http';
import replyFrom from '@fastify/reply-from';
import { authPlugin, forwardHeaders, guard as guardHook } from '@idem/fastify';
import {
  createGuard,
  createInternalTokenIssuer,
  type Guard,
  hasQueryToken,
  type InternalTokenIssuer,
  type IssuerOptions,
  withoutHopByHop,
} from '@idem/guard';
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { accessTokenClockTolerance } from '../clock-tolerance.js';
import { dpopAlgorithms } from '../dpop-algorithms.js';
import { type Drain, defaultGraceMs, drainable } from '../drain.js';
import type { ListeningPort } from '../listen.js';
import { toOwnOriginForm } from '../request-target.js';
import { answerStartingUp, refuseStartingUp } from '../starting-up.js';
import { discoverProvider } from './discovery.js';
import {
  clientErrorProblem,
  frameworkProblem,
  methodNotAllowedProblem,
  pathMalformedProblem,
  sendProblem,
  sendStartingUp,
  upstreamFailureProblem,
} from './problems.js';

/** The `realm` of the gateway's challenges, and of those the services behind it answer with. */
export const gatewayRealm = 'reference-api';

/**
 * The gateway's health route, for an operator's probe (a load balancer, an orchestrator's readiness
 * check), which sends no token: every other path needs one and answers such a probe 401. The `z`
 * keeps it off names the services behind the gateway might use.
 */
const healthPath = '/healthz';

/** Where the gateway serves its RFC 9728 protected resource metadata. */
export const resourceMetadataPath = '/.well-known/oauth-protected-resource';

/**
 * The gateway's RFC 9728 metadata URL for the base URL `baseUrl`, named in its challenges.
 *
 * @example
 * ```ts
 * resourceMetadataUrl('http://localhost:8080'); // 'http://localhost:8080/.well-known/oauth-protected-resource'
 * ```
 */
export function resourceMetadataUrl(baseUrl: string): string {
  // BASE_URL is often written with a trailing slash; `//.well-known/...` is no route of the gateway.
  return `${baseUrl.replace(/\/+$/, '')}${resourceMetadataPath}`;
}

// The methods the gateway forwards; the API answers 405 itself for a resource that takes fewer.
const forwardedMethods = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

/** Another service behind the gateway, reached for every path under `prefix`. */
export interface GatewayUpstream {
  /** A path prefix such as `/webhook-events`; the path itself and everything under it go to `url`. */
  prefix: string;
  /** The service's origin, e.g. `http://127.0.0.1:8084`. */
  url: string;
  /** The `aud` of the internal tokens minted for this service (each service accepts only its own). */
  audience: string;
}

/** Options of {@link startGateway}. */
export interface GatewayOptions {
  /**
   * Port (env GATEWAY_PORT, default 8080); 0 for an ephemeral one. Or a port already bound with
   * `listen()`, when the identity provider and the app need the gateway's URL before it starts
   * (the URL is the access tokens' audience); the gateway then owns and closes it.
   */
  port: number | ListeningPort;
  /** Interface to bind. Default `127.0.0.1`. */
  host?: string | undefined;
  /**
   * The gateway's public base URL (env BASE_URL, default `http://localhost:<port>`): the audience
   * every access token must carry (the resource indicator the identity provider binds tokens to).
   */
  baseUrl?: string | undefined;
  /** The API the gateway forwards to, e.g. `http://127.0.0.1:8082`. */
  apiUrl: string;
  /** The API's name: the `aud` of the internal tokens minted for it. Default `reference-api`. */
  apiAudience?: string | undefined;
  /** Services other than the API, by path prefix; everything else goes to the API. */
  upstreams?: readonly GatewayUpstream[] | undefined;
  /** The identity provider's issuer (env AUTH_URL); its keys come from the `jwks_uri` of its discovery document. */
  authUrl?: string | undefined;
  /**
   * Trusted issuers, replacing discovery at `authUrl` (tests inject a test issuer's keys). Their
   * audience defaults to `baseUrl`.
   */
  issuers?: readonly IssuerOptions[] | undefined;
  /** The internal token issuer; default one with a fresh Ed25519 key, `iss` = `baseUrl`. */
  internalIssuer?: InternalTokenIssuer | undefined;
  /** Scopes announced in the protected-resource metadata (RFC 9728). */
  scopesSupported?: readonly string[] | undefined;
  /** Clock of the token checks, epoch ms. */
  now?: (() => number) | undefined;
  /** `fetch` for discovery and the JWKS. */
  fetch?: typeof globalThis.fetch | undefined;
  /**
   * How long the gateway waits for the API's head, and then between body chunks, in ms, before it
   * answers 504 `upstream_timeout` (or cuts the answer already under way). Default 30 000; without
   * it an API that accepts the connection and never answers held each request for undici's 300 s.
   */
  upstreamTimeout?: number | undefined;
  /**
   * Once closing, how long the requests already running may take to finish, in ms, before what
   * still runs is cut (a request the API never answers would otherwise hold the shutdown for
   * undici's 300 s). Default 10 000, as every other component of the app; 0 cuts them at once.
   */
  shutdownGraceMs?: number | undefined;
}

/** A running gateway. */
export interface RunningGateway {
  /** Where it listens, `http://localhost:<port>`. */
  readonly url: string;
  /** The public base URL: the audience every access token must carry. */
  readonly baseUrl: string;
  /** Signs the internal tokens; give `() => internalIssuer.jwks()` to the API (a function, so it follows `rotate()`). */
  readonly internalIssuer: InternalTokenIssuer;
  readonly guard: Guard;
  close(): Promise<void>;
}

/**
 * Stripped on top of the guard's identity families and the bearer: the client's cookies, proxy
 * credentials and DPoP proof, which are credentials for the gateway's origin, not the API's.
 */
const strippedCredentials = ['cookie', 'proxy-authorization', 'dpop'];

/**
 * True when the request target `url` resolves, against `origin`, to a path on that origin (an
 * absolute-form target naming another origin than the gateway's own does not). WHATWG URL
 * parsing, which the proxy uses, reads a backslash as a slash: `/\\evil.example/x` names another
 * host (the proxy then refuses it with an error of no status, a 500) and `/\\?` does not parse at
 * all. A backslash has no place in a request target (RFC 3986 has it percent-encoded), so such a
 * path is refused as malformed before it reaches the proxy.
 */
function staysOnOrigin(url: string, origin: string): boolean {
  if (url.includes('\\')) return false;
  // The proxy's own rule: a target starting `//` is a path, not a network-path reference.
  const target = URL.parse(url.startsWith('//') ? `.${url}` : url, origin);
  return target !== null && target.origin === new URL(origin).origin;
}

/**
 * Starts the gateway: a Fastify reverse proxy (`@fastify/reply-from`) in front of the API.
 *
 * For every request: the access token is verified with the guard (issuer exactly the identity
 * provider, keys from its JWKS, `aud` = this gateway's base URL, `typ` `at+jwt`, the RFC 9068 claims
 * `client_id`, `iat`, `jti` required); a bad or missing token is 401 problem+json with an RFC 6750
 * challenge, before any byte of the body is read. Then the client's identity headers are stripped by
 * namespace (`X-User-*`, `X-Auth-*`, underscore and case variants too), the bearer is dropped, and a
 * 60-second internal token for the API (`aud` = the API, signed with the gateway's Ed25519 key) is
 * added. The body streams through untouched, so the API fingerprints the client's exact bytes.
 *
 * @example
 * ```ts
 * const gateway = await startGateway({ port: 8080, apiUrl: api.url, authUrl: 'http://localhost:8081' });
 * console.log(gateway.url); // http://localhost:8080
 * ```
 */
export async function startGateway(options: GatewayOptions): Promise<RunningGateway> {
  const apiAudience = options.apiAudience ?? 'reference-api';
  const upstreams = options.upstreams ?? [];
  for (const upstream of upstreams) {
    if (!/^\/[a-z0-9-]+$/.test(upstream.prefix)) {
      throw new TypeError('startGateway: an upstream prefix is one lower-case path segment, such as /webhook-events');
    }
  }
  // The path alone decides: `/webhook-events` and `/webhook-events/...`, never `/webhook-events-x`.
  const upstreamOf = (url: string) => {
    const path = url.split('?')[0] ?? '';
    return upstreams.find((upstream) => path === upstream.prefix || path.startsWith(`${upstream.prefix}/`));
  };
  // Checked before anything listens. Capped where setTimeout stops counting: a longer one fires at once.
  const shutdownGraceMs = options.shutdownGraceMs ?? defaultGraceMs;
  if (!Number.isSafeInteger(shutdownGraceMs) || shutdownGraceMs < 0 || shutdownGraceMs > 2_147_483_647) {
    throw new TypeError('shutdownGraceMs must be a whole number of milliseconds, from 0 to 2147483647');
  }
  const bound = typeof options.port === 'number' ? undefined : options.port;
  let issuers = options.issuers;
  if (issuers === undefined) {
    if (options.authUrl === undefined) throw new TypeError('startGateway needs authUrl or issuers');
    const { jwksUri } = await discoverProvider(options.authUrl, options.fetch);
    issuers = [
      {
        issuer: options.authUrl,
        jwksUri,
        // The identity provider signs access tokens with RS256 only; nothing else is worth accepting.
        algorithms: ['RS256'],
        requiredClaims: ['client_id', 'iat', 'jti'],
      },
    ];
  }

  // Fastify's and reply-from's own errors (a path that does not decode, a `..` reply-from refuses to
  // forward) would be `application/json`: they get the gateway's problem+json like every other error.
  const frameworkError = (error: unknown, _request: FastifyRequest, reply: FastifyReply) => {
    const problem = frameworkProblem(error);
    return sendProblem(reply, problem.status, problem);
  };
  // The gateway closes as the other servers do (see drainable): Fastify's own close would keep a
  // connection busy at the time open for its whole keep-alive timeout (72 s), with no grace for a
  // request the API never answers. So the server is made here, or is the port bound beforehand.
  let drain: Drain | undefined;
  // The origins the gateway answers for (the URL it listens on, its public base URL), known once it
  // listens: an absolute-form target naming one is the path it holds, read so before Fastify routes it
  // and the guard checks a DPoP proof's `htu` against it. Any other stays absolute, and is refused
  // below as a path that leaves its service.
  const ownOrigins = new Set<string>();
  // The guard and the internal issuer need the base URL, which an ephemeral port only gives after
  // listen; until they exist every request gets the 503 `starting_up` with Retry-After (nothing
  // half-configured answers). Declared before Fastify is made: a port bound beforehand hands it
  // requests from then on.
  let ready:
    | { guard: Guard; internal: InternalTokenIssuer; verify: (request: FastifyRequest, reply: FastifyReply) => unknown }
    | undefined;
  const app = Fastify({
    logger: false,
    // Errors raised before any route runs (FST_ERR_BAD_URL); the error handler below takes the rest.
    frameworkErrors: frameworkError,
    // Requests Node's parser refused (malformed heads, oversize headers): problems too, and before
    // the gateway is ready the same 503 as every other request.
    clientErrorHandler: (error, socket) =>
      ready ? clientErrorProblem(error, socket) : refuseStartingUp(error, socket),
    serverFactory: (fastifyHandler: Parameters<ListeningPort['use']>[0]): Server => {
      const handler: typeof fastifyHandler = (req, res) => {
        // Answered before Fastify sees the request: its router, its content-type parsers and its
        // framework errors (a path that does not decode) would otherwise answer it first, each in its
        // own way, and no route's check of `ready` would run.
        if (!ready) {
          answerStartingUp(res);
          return;
        }
        toOwnOriginForm(req, ownOrigins);
        fastifyHandler(req, res);
      };
      if (bound) {
        // As sent: the port's own reading would take an absolute-form target naming any host.
        bound.use(handler, 'as-sent');
        return bound.server;
      }
      const server = createServer(handler);
      drain = drainable(server);
      return server;
    },
  });
  app.setErrorHandler(frameworkError);
  // Bodies are not parsed here: the stream goes to the API byte for byte.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_request, payload, done) => done(null, payload));
  // No fixed `base`: reply-from would then send every request to it. Each request names its upstream
  // through `getUpstream` below, and reply-from still keeps the path inside that origin.
  const upstreamTimeout = options.upstreamTimeout ?? 30_000;
  if (!Number.isSafeInteger(upstreamTimeout) || upstreamTimeout < 1) {
    throw new TypeError('upstreamTimeout must be a whole number of milliseconds, at least 1');
  }
  await app.register(replyFrom, {
    // Never retry on the client's behalf: a repeated POST is the client's decision, with its key.
    retryMethods: [],
    disableRequestLogging: true,
    undici: { headersTimeout: upstreamTimeout, bodyTimeout: upstreamTimeout },
  });

  await app.register(authPlugin);

  app.get(resourceMetadataPath, async (_request, reply) => {
    // Not reached before ready (the server's handler answers first), here and in the routes below:
    // these checks only spare the types a non-null assertion.
    if (!ready) return sendStartingUp(reply);
    reply.header('cache-control', 'public, max-age=300');
    return {
      resource: baseUrl,
      authorization_servers: options.authUrl ? [options.authUrl] : (issuers ?? []).map((issuer) => issuer.issuer),
      bearer_methods_supported: ['header'],
      dpop_signing_alg_values_supported: [...dpopAlgorithms],
      ...(options.scopesSupported ? { scopes_supported: [...options.scopesSupported] } : {}),
    };
  });

  // 200 once the gateway checks tokens (before, the server's handler answers 503 `starting_up` with
  // Retry-After; once it closes, new connections are refused). The gateway's own state only, not the
  // services': a probe that failed while the API is down would take the gateway out of its balancer
  // too, and its callers would get no answer at all instead of a retryable 502. Nothing forwarded,
  // no token read; GET and HEAD only, any other method goes through the guard as every path does.
  app.get(healthPath, async (_request, reply) => {
    if (!ready) return sendStartingUp(reply);
    reply.header('cache-control', 'no-store');
    return { status: 'ok' };
  });

  // Any other method Node parses (PROPFIND, TRACE, LOCK, ...) matches no route: Fastify's own 404
  // would answer it before the guard, as JSON that echoes the method and path. The guard answers it
  // first, as it does every request; an authenticated caller then gets 405 with the methods taken.
  app.setNotFoundHandler(async (request, reply) => {
    if (!ready) return sendStartingUp(reply);
    await ready.verify(request, reply);
    if (reply.sent) return reply;
    reply.header('allow', forwardedMethods.join(', '));
    return sendProblem(reply, 405, methodNotAllowedProblem);
  });

  app.route({
    method: [...forwardedMethods],
    url: '/*',
    // The earliest hook: a refused request never has its body read, let alone forwarded.
    onRequest: async (request, reply) => {
      if (!ready) return sendStartingUp(reply);
      await ready.verify(request, reply);
      if (reply.sent) return reply;
      // A token in the query too (RFC 6750 §2.3): forwarded, it would reach the service's access log.
      // Not stripped: a header and a query token are two methods in one request (RFC 6750 §2), which
      // the guard refuses as 400 invalid_request where it reads the query; the client learns to stop
      // putting a token in URLs. Checked after the guard, so a token only in the query stays what
      // the guard makes of it: no credential, 401 without an error code.
      if (hasQueryToken(request.url)) {
        const refusal = ready.guard.error('multiple_tokens');
        return sendProblem(reply, refusal.status, refusal.toProblem(), refusal.wwwAuthenticate);
      }
      return undefined;
    },
    handler: async (request, reply) => {
      if (!ready || !request.auth) return sendStartingUp(reply);
      const upstream = upstreamOf(request.url);
      // A target still absolute names another origin than the gateway's (toOwnOriginForm took its
      // own): refused even when it names the upstream, which resolved onto it and went through.
      if (!request.url.startsWith('/') || !staysOnOrigin(request.url, upstream?.url ?? options.apiUrl)) {
        return sendProblem(reply, 400, pathMalformedProblem);
      }
      const forwarded = await forwardHeaders(request, {
        issuer: ready.internal,
        audience: upstream?.audience ?? apiAudience,
        extra: strippedCredentials,
      });
      return reply.from(undefined, {
        getUpstream: () => upstream?.url ?? options.apiUrl,
        // reply-from hands over the client's headers with `host` set to the API; what goes is what
        // forwardHeaders made of them (stripped, with the internal token), and that host. Not
        // reply-from's own copy: it drops whatever `Connection` names, the Idempotency-Key too, which
        // forwardHeaders keeps (without it each retry would run as a new operation).
        rewriteRequestHeaders: (_request, headers) => ({ ...forwarded, host: headers.host }),
        // The API's hop-by-hop headers describe the gateway's connection to it, not the client's.
        rewriteHeaders: (headers) => withoutHopByHop(headers),
        onError: (failed, { error }) => {
          const problem = upstreamFailureProblem(error);
          sendProblem(failed as FastifyReply, problem.status, problem);
        },
      });
    },
  });

  await app.ready();
  // Listened on here, not by Fastify: its close then leaves the server to the drain.
  if (!bound) await listenOn(app.server, options.port as number, options.host ?? '127.0.0.1');
  const closeServer = () => (bound ? bound.close(shutdownGraceMs) : (drain as Drain).close(shutdownGraceMs));
  const address = app.server.address();
  const port = typeof address === 'object' && address !== null ? address.port : Number(options.port);
  const url = bound?.url ?? `http://localhost:${port}`;
  const baseUrl = options.baseUrl ?? `http://localhost:${port}`;
  try {
    ownOrigins.add(new URL(url).origin).add(new URL(baseUrl).origin);
    const guard = createGuard({
      audience: baseUrl,
      issuers,
      realm: gatewayRealm,
      resourceMetadata: resourceMetadataUrl(baseUrl),
      // The provider binds the tokens of any client that sends it a DPoP proof (RFC 9700 section 2.2.2
      // recommends it for public clients): such a token must work here with its proofs, or that client
      // could call nothing. The origin is ours, never the Host header a client writes.
      dpop: { origin: new URL(baseUrl).origin, algorithms: [...dpopAlgorithms] },
      // The provider's introspection of its JWTs allows the same skew: both agree on a token's life.
      clockTolerance: accessTokenClockTolerance,
      ...(options.now ? { now: options.now } : {}),
      ...(options.fetch ? { fetch: options.fetch } : {}),
    });
    await guard.ready();
    const internal =
      options.internalIssuer ??
      createInternalTokenIssuer({ issuer: baseUrl, ...(options.now ? { now: options.now } : {}) });
    ready = { guard, internal, verify: guardHook(guard) };
  } catch (error) {
    await closeServer();
    await app.close();
    throw error;
  }
  return {
    url,
    baseUrl,
    internalIssuer: ready.internal,
    guard: ready.guard,
    // The requests running first (up to the drain's grace), then Fastify's own hooks (reply-from's
    // connections to the API): closed first, those would cut the requests being forwarded.
    async close() {
      await closeServer();
      await app.close();
    },
  };
}

function listenOn(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}
