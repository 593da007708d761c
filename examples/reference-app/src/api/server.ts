import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duration, IdempotencyEvent } from '@idem/core';
import { internalAuth } from '@idem/express';
import { createInternalVerifier, type Guard, type LocalJwks } from '@idem/guard';
import { postgresStore } from '@idem/postgres';
import { type RedisClientLike, redisStore } from '@idem/redis';
import { createOutbox, createSender, type Relay, type RelayRound } from '@idem/webhooks';
import express, { type NextFunction, type Request, type Response } from 'express';
import { clientErrorStatus } from '../client-error.js';
import type { Database } from '../db.js';
import { dbUnavailable, storeRetryAfterSeconds } from '../db-unavailable.js';
import { drainable } from '../drain.js';
import { idempotencyLogger } from '../idempotency-log.js';
import { methodNotAllowed } from '../methods.js';
import { withOriginForm } from '../request-target.js';
import { apiTables, migrateApi } from '../schema/api-schema.js';
import { webhookSchedule } from '../webhook-schedule.js';
import { registerChargeRoutes } from './charges.js';
import { registerPhotoRoutes } from './photos.js';
import { sendProblem } from './problem.js';
import { registerSettingsRoutes } from './settings.js';
import { registerStockRoutes } from './stock.js';

/** How the API recognises the gateway's internal tokens. */
export interface InternalTokenTrust {
  /** The gateway's issuer name (`iss` of its internal tokens). */
  issuer: string;
  /** This API's name: the `aud` the gateway mints for it. */
  audience: string;
  /** The gateway's public keys (`() => internalIssuer.jwks()`, which follows its `rotate()`), or a URL serving them. */
  jwks?: LocalJwks | undefined;
  jwksUri?: string | undefined;
  /**
   * The gateway's challenge attributes (its `realm`, its RFC 9728 metadata URL), for the 403s this
   * service answers through it: to the client, they come from the one resource it called.
   */
  challenge?: ServiceChallenge | undefined;
}

/** What a service behind the gateway puts in its challenges, so they read like the gateway's own. */
export interface ServiceChallenge {
  realm: string;
  resourceMetadata?: string | undefined;
}

/** Options of {@link startApi}. */
export interface ApiOptions {
  /** Port (env API_PORT, default 8082); 0 for an ephemeral one. */
  port: number;
  /** Interface to bind. Default `127.0.0.1`: the API is reachable on loopback only, behind the gateway. */
  host?: string | undefined;
  db: Database;
  /**
   * The caller already ran `migrateApi` on `db` (as `startResourceStack` does before it starts the
   * receiver and the API): not run again. Default false: the tables are made (or checked) here.
   */
  schemaReady?: boolean | undefined;
  internal: InternalTokenTrust;
  /** The webhook receiver's endpoint for `payment.succeeded`. */
  webhookUrl: string;
  /** The Standard Webhooks secret (`whsec_...`) events are signed with. */
  webhookSecret: string;
  /** Run the outbox relay in the background (default `{ pollInterval: '1s' }`); `false` to drive it with `relayOnce()`. */
  relay?: false | { pollInterval?: Duration | undefined } | undefined;
  /** Clock of the internal-token checks and of the webhook signatures, epoch ms. */
  now?: (() => number) | undefined;
  /**
   * Redis (env REDIS_URL) for the idempotency keys of the routes that are not transactional
   * (`POST /photos`); the caller owns the client. Without it those keys live in the SQL database.
   * Charges stay on the SQL store either way: their key commits with the charge and its event.
   */
  redis?: { client: RedisClientLike; prefix?: string | undefined } | undefined;
  /**
   * Told every idempotency event of the API's keyed routes (`POST /charges`, `POST /photos`), with
   * its record id, never the key. Default: one line on stderr for each event an operator should look
   * at (a store error, a lost lease, a claim that took over a crashed attempt, ...; see
   * {@link idempotencyLogger}), `API: idempotency ...`, nothing for a claim, a replay or a completion.
   */
  onIdempotencyEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /** The lease of the keyed routes' claims (`POST /charges`, `POST /photos`). Default the core's, `'10s'`. */
  idempotencyLease?: Duration | undefined;
}

/** A running API. */
export interface RunningApi {
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  /** The internal-token verifier the API checks every request with. */
  readonly verifier: Guard;
  /** Delivers the outbox's due events once (what the background relay does every poll). */
  relayOnce(): Promise<RelayRound>;
  /** Stops the relay and the server. The database stays open: its owner closes it. */
  close(): Promise<void>;
}

/**
 * Starts the API on Express: every request must carry the gateway's internal token (a direct call
 * without it is 401); routes authorize from its claims. Charges are idempotent and transactional on
 * the PostgreSQL/PGlite store; their `payment.succeeded` events leave through the outbox, whose relay
 * runs in this process and signs with Standard Webhooks.
 *
 * @example
 * ```ts
 * const internalIssuer = createInternalTokenIssuer({ issuer: 'http://localhost:8080' });
 * const api = await startApi({
 *   port: 8082,
 *   db,
 *   internal: { issuer: internalIssuer.issuer, audience: 'reference-api', jwks: () => internalIssuer.jwks() },
 *   webhookUrl: 'http://localhost:8084/webhooks/payments',
 *   webhookSecret: await loadWebhookSecret(db),
 * });
 * ```
 */
export async function startApi(options: ApiOptions): Promise<RunningApi> {
  const { db } = options;
  if (!options.schemaReady) await migrateApi(db);
  const verifier = createInternalVerifier({
    issuer: options.internal.issuer,
    audience: options.internal.audience,
    ...(options.internal.jwks ? { jwks: options.internal.jwks } : {}),
    ...(options.internal.jwksUri ? { jwksUri: options.internal.jwksUri } : {}),
    ...options.internal.challenge,
    ...(options.now ? { now: options.now } : {}),
  });
  await verifier.ready();
  const store = postgresStore({ client: db.client, table: apiTables.idempotency });
  const plainStore = options.redis
    ? redisStore({ client: options.redis.client, prefix: options.redis.prefix ?? 'idem:reference-api:' })
    : postgresStore({ client: db.client, table: apiTables.plainIdempotency });
  const outbox = createOutbox({ table: apiTables.outbox });

  const app = express();
  app.disable('x-powered-by');
  app.use(internalAuth(verifier));
  // The operators' trail: without it a "charged twice" ticket has nothing to follow.
  const onEvent = options.onIdempotencyEvent ?? idempotencyLogger('API');
  const lease = options.idempotencyLease === undefined ? {} : { lease: options.idempotencyLease };
  registerChargeRoutes(app, { store, outbox, webhookUrl: options.webhookUrl, onEvent, ...lease });
  registerStockRoutes(app, { db });
  registerPhotoRoutes(app, { db, store: plainStore, onEvent, ...lease });
  registerSettingsRoutes(app, { db });
  app.use(
    methodNotAllowed(app, (_req, res, allow) =>
      sendProblem(res, 'method_not_allowed', `This resource takes ${allow.join(', ')}.`),
    ),
  );
  app.use((_req: Request, res: Response) => sendProblem(res, 'route_not_found', 'No resource at this path.'));
  app.use(bodyErrors);

  const sender = createSender({
    secret: options.webhookSecret,
    timeout: '5s',
    schedule: webhookSchedule,
    ...(options.now ? { now: options.now } : {}),
  });
  const pollInterval = options.relay === false ? '1s' : (options.relay?.pollInterval ?? '1s');
  const relay: Relay = outbox.relay({ db, sender, pollInterval });

  const server = createServer(withOriginForm(app, 'problem'));
  const drain = drainable(server);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  if (options.relay !== false) relay.start();
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    verifier,
    relayOnce: () => relay.runOnce(),
    async close() {
      await relay.stop();
      await drain.close();
    },
  };
}

/**
 * The API's last error handler. body-parser's errors blame the request: each is a 4xx with
 * `expose` (see {@link clientErrorStatus}) and becomes a problem with that status, 413 `body_too_large`,
 * 415 `unsupported_media_type` (a charset other than UTF-8, an unknown `Content-Encoding`) or 400
 * `body_malformed` (bad JSON, a body that does not inflate, an aborted upload), and the router's 400
 * for a path parameter that does not decode is `path_malformed`. A database that could not answer
 * (see {@link dbUnavailable}) is 503 `database_unavailable` with Retry-After. Anything else is a bug
 * and says nothing more than 500 `internal_error`.
 */
function bodyErrors(error: unknown, _req: Request, res: Response, next: NextFunction): void {
  if (res.headersSent) {
    next(error);
    return;
  }
  const status = clientErrorStatus(error);
  const type = (error as { type?: unknown } | null)?.type;
  if (status === 413) sendProblem(res, 'body_too_large', 'The body is larger than this route accepts.');
  else if (status === 415 && type === 'charset.unsupported') {
    sendProblem(res, 'unsupported_media_type', 'Send the body as JSON in UTF-8 (application/json; charset=utf-8).');
  } else if (status === 415) {
    sendProblem(
      res,
      'unsupported_media_type',
      'The Content-Encoding is not supported; send identity, gzip, deflate or br.',
    );
  } else if (type === 'entity.parse.failed') sendProblem(res, 'body_malformed', 'The body is not valid JSON.');
  // The router's: a path parameter that does not percent-decode (`/photos/%zz`). The gateway refuses
  // such a path before it is forwarded; this is for a direct call with the gateway's internal token.
  else if (error instanceof URIError && status === 400) {
    sendProblem(res, 'path_malformed', 'A path parameter does not decode as UTF-8.');
  } else if (status !== undefined) sendProblem(res, 'body_malformed', 'The body could not be read.');
  else if (dbUnavailable(error)) {
    // DESIGN.md's HTTP table: a store that failed is a 503 with Retry-After, never a 500.
    res.set('Retry-After', String(storeRetryAfterSeconds));
    sendProblem(res, 'database_unavailable', 'The database could not be reached; send the request again later.');
  } else sendProblem(res, 'internal_error', 'The request could not be processed.');
}
