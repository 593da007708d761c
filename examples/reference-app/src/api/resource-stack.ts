import type { Duration, IdempotencyEvent } from '@idem/core';
import { createInternalTokenIssuer, type IssuerOptions } from '@idem/guard';
import { postgresStore } from '@idem/postgres';
import type { RedisClientLike } from '@idem/redis';
import { createOutbox } from '@idem/webhooks';
import type { Database } from '../db.js';
import { gatewayRealm, type RunningGateway, resourceMetadataUrl, startGateway } from '../gateway/server.js';
import type { ListeningPort } from '../listen.js';
import { purgeEvery } from '../purge-every.js';
import { type RunningReceiver, receiverAdminPrefix, startReceiver } from '../receiver/server.js';
import { apiTables, loadWebhookSecret, migrateApi } from '../schema/api-schema.js';
import { seedApi } from '../schema/seed-api.js';
import { apiScopes } from '../scopes.js';
import { closeInOrder } from '../shutdown.js';
import { type RunningApi, startApi } from './server.js';

/** Options of {@link startResourceStack}. Ports may be 0 (ephemeral). */
export interface ResourceStackOptions {
  db: Database;
  /** env GATEWAY_PORT, default 8080; or a port bound beforehand with `listen()` (its URL is then the base URL). */
  gatewayPort: number | ListeningPort;
  /** env API_PORT, default 8082. */
  apiPort: number;
  /** env RECEIVER_PORT, default 8084. */
  receiverPort: number;
  /** The gateway's public URL and the access tokens' audience (env BASE_URL); default `http://localhost:<gatewayPort>`. */
  baseUrl?: string | undefined;
  /** The identity provider's issuer (env AUTH_URL); the gateway discovers its JWKS. */
  authUrl?: string | undefined;
  /** Trusted issuers instead of discovery (tests). */
  issuers?: readonly IssuerOptions[] | undefined;
  /** The `iss` of the gateway's internal tokens. Default `reference-gateway`. */
  internalIssuerName?: string | undefined;
  /** The API's background outbox relay; `false` to drive it with `api.relayOnce()`. */
  relay?: false | { pollInterval?: Duration | undefined } | undefined;
  /** Seed the demo photos and stock (default true). */
  seed?: boolean | undefined;
  /** Redis (env REDIS_URL) for the idempotency keys of the API's non-transactional routes. */
  redis?: { client: RedisClientLike; prefix?: string | undefined } | undefined;
  /** Clock of every token and signature check, epoch ms. */
  now?: (() => number) | undefined;
  /**
   * The lease of every idempotency key the stack claims (the API's charges and photos, the receiver's
   * inbox and notes; env IDEMPOTENCY_LEASE_SECONDS): how long the key of an execution that crashed
   * stays locked before a retry may take it over. Default the core's, `'10s'`.
   */
  idempotencyLease?: Duration | undefined;
  /** `fetch` the gateway uses for discovery and the JWKS. */
  fetch?: typeof globalThis.fetch | undefined;
  /**
   * How often expired idempotency records (the API's and the receiver's) are deleted, in milliseconds:
   * a whole number from 1 to 2147483647, else a `TypeError` before anything starts. Default ten minutes.
   */
  purgeEveryMs?: number | undefined;
  /**
   * The API's idempotency events (`startApi`'s `onIdempotencyEvent`; default: a line on stderr for
   * those worth a look).
   */
  onApiIdempotencyEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /**
   * The receiver's idempotency events (`startReceiver`'s `onIdempotencyEvent`; default: a line on
   * stderr for those worth a look).
   */
  onReceiverIdempotencyEvent?: ((event: IdempotencyEvent) => void) | undefined;
}

/** The running resource side of the reference app. */
export interface RunningResourceStack {
  readonly gateway: RunningGateway;
  readonly api: RunningApi;
  readonly receiver: RunningReceiver;
  /** Stops the gateway, then the API (and its relay), then the receiver. The database stays open. */
  close(): Promise<void>;
}

/**
 * Starts the resource side of the reference app on one database, in the order each part needs the
 * previous one: schema and seed rows, the webhook receiver (its URL goes to the API's outbox), the
 * API (trusting the gateway's internal-token keys, generated here at start and followed across `rotate()`), and the gateway in
 * front of it.
 *
 * @example
 * ```ts
 * const stack = await startResourceStack({
 *   db,
 *   gatewayPort: 8080,
 *   apiPort: 8082,
 *   receiverPort: 8084,
 *   baseUrl: 'http://localhost:8080',
 *   authUrl: 'http://localhost:8081',
 * });
 * console.log(stack.gateway.url, stack.api.url, stack.receiver.url);
 * await stack.close();
 * ```
 */
export async function startResourceStack(options: ResourceStackOptions): Promise<RunningResourceStack> {
  const { db } = options;
  const started: Array<{ close(): Promise<void> }> = [];
  try {
    const purgeEveryMs = purgeEvery(options.purgeEveryMs, 'purgeEveryMs');
    await migrateApi(db);
    if (options.seed !== false) await seedApi(db);
    const webhookSecret = await loadWebhookSecret(db);
    const now = options.now ? { now: options.now } : {};
    const lease = options.idempotencyLease === undefined ? {} : { idempotencyLease: options.idempotencyLease };
    const internalIssuer = createInternalTokenIssuer({
      issuer: options.internalIssuerName ?? 'reference-gateway',
      ...now,
    });
    const apiAudience = 'reference-api';
    const receiverAudience = 'reference-receiver';
    // A 403 comes from the API or the receiver, a 401 from the gateway: both challenges must name the
    // same realm and RFC 9728 metadata, or a client reading the 403 cannot find where to step up. The
    // base URL (the gateway's default for it: `http://localhost:<port>`) is known here unless the
    // gateway is yet to take an ephemeral port and none is given (tests only).
    const gatewayPortNumber = typeof options.gatewayPort === 'number' ? options.gatewayPort : options.gatewayPort.port;
    const knownBaseUrl =
      options.baseUrl ?? (gatewayPortNumber === 0 ? undefined : `http://localhost:${gatewayPortNumber}`);
    const challenge = {
      realm: gatewayRealm,
      ...(knownBaseUrl === undefined ? {} : { resourceMetadata: resourceMetadataUrl(knownBaseUrl) }),
    };
    // A function, read on every lookup: a copy of `jwks()` taken now would refuse every token once a
    // `gateway.internalIssuer.rotate()` made a new key sign.
    const internal = { issuer: internalIssuer.issuer, jwks: () => internalIssuer.jwks(), challenge };

    const receiver = await startReceiver({
      port: options.receiverPort,
      db,
      schemaReady: true,
      webhookSecret,
      internal: { ...internal, audience: receiverAudience },
      ...(options.onReceiverIdempotencyEvent ? { onIdempotencyEvent: options.onReceiverIdempotencyEvent } : {}),
      ...lease,
      ...now,
    });
    started.push(receiver);
    const api = await startApi({
      port: options.apiPort,
      db,
      schemaReady: true,
      internal: { ...internal, audience: apiAudience },
      webhookUrl: receiver.webhookUrl,
      webhookSecret,
      ...(options.relay === undefined ? {} : { relay: options.relay }),
      ...(options.redis ? { redis: options.redis } : {}),
      ...(options.onApiIdempotencyEvent ? { onIdempotencyEvent: options.onApiIdempotencyEvent } : {}),
      ...lease,
      ...now,
    });
    started.push(api);
    const gateway = await startGateway({
      port: options.gatewayPort,
      apiUrl: api.url,
      apiAudience,
      // The receiver's admin API (Koa) sits behind the same gateway, with internal tokens of its own.
      upstreams: [{ prefix: receiverAdminPrefix, url: receiver.url, audience: receiverAudience }],
      internalIssuer,
      scopesSupported: apiScopes,
      ...(options.baseUrl ? { baseUrl: options.baseUrl } : {}),
      ...(options.authUrl ? { authUrl: options.authUrl } : {}),
      ...(options.issuers ? { issuers: options.issuers } : {}),
      ...(options.fetch ? { fetch: options.fetch } : {}),
      ...now,
    });
    const purge = purgeExpiredRecords(db, purgeEveryMs);
    return {
      gateway,
      api,
      receiver,
      close() {
        // The gateway first: once it stops taking requests, the API behind it drains what it forwarded.
        return closeInOrder([
          { name: 'the gateway', close: () => gateway.close() },
          { name: 'the purge of expired records', close: () => purge.stop() },
          { name: 'the API', close: () => api.close() },
          { name: 'the receiver', close: () => receiver.close() },
        ]);
      },
    };
  } catch (error) {
    for (const component of started.reverse()) await component.close().catch(() => undefined);
    // A pre-bound gateway port belongs to the gateway, which closes it itself once started (or when
    // its own start fails); when an earlier part failed (an option, the schema, the seed rows) it
    // never got that far, so close it here.
    if (typeof options.gatewayPort !== 'number' && options.gatewayPort.server.listening) {
      await options.gatewayPort.close().catch(() => undefined);
    }
    throw error;
  }
}

const purgeBatch = 1_000;

/**
 * How long the outbox keeps a delivered event (for support to see what was sent) and a dead-lettered
 * one (for an operator to requeue). A charge's key is kept a day, so no retry adds an event again
 * after a week, nor after a dead row is gone: it is kept 30 days after it died (the outbox counts a
 * dead row's age from `dead_at`), however long it retried first (up to its sender's one-year
 * horizon, `webhookSchedule`), so that an operator has a month to see and requeue it. The receiver's
 * `webhookRetention` is another matter (how long it recognises an id) and does not depend on this.
 * A row dead-lettered before the outbox kept `dead_at` is aged from its last scheduled attempt,
 * about when it died.
 */
export const outboxKept = { delivered: '7d', dead: '30d' } as const;

/**
 * Deletes expired idempotency records every `everyMs`, from the API's tables and the receiver's inbox,
 * and the outbox's old delivered and dead events (`outboxKept`): without it the outbox only grows.
 * PostgreSQL keeps an expired record's row (invisible to every request) until it is purged
 * (docs/operations.md, "Purge jobs"): without this, every stored response and webhook id would stay
 * for good, long past the retention. Records in progress go an hour after their keep (the store's
 * grace), so a transactional charge still running keeps its row. A pass still running when the next
 * tick comes is not doubled; a failed one is said on stderr and tried again at the next tick. stop()
 * ends a pass under way after its current batch and waits for that, so none is cut by the database
 * closing.
 */
function purgeExpiredRecords(db: Database, everyMs: number): { stop(): Promise<void> } {
  const stores = [apiTables.idempotency, apiTables.plainIdempotency, apiTables.receiverInbox].map((table) =>
    postgresStore({ client: db.client, table }),
  );
  const outbox = createOutbox({ table: apiTables.outbox });
  // Aborted by stop(): a pass working through a backlog (the first after an upgrade, with every
  // event the outbox ever delivered) ends after the batch under way, not after the whole backlog,
  // which a process manager's stop timeout would cut with a SIGKILL. The next start goes on.
  const stopping = new AbortController();
  const { signal } = stopping;
  let running: Promise<void> | undefined;
  const pass = async () => {
    for (const store of stores) {
      while (!signal.aborted && (await store.purgeExpired({ batchSize: purgeBatch })) === purgeBatch) {}
    }
    await outbox.purge(db, { olderThan: outboxKept.delivered, signal });
    await outbox.purge(db, { olderThan: outboxKept.dead, dead: true, signal });
  };
  const timer = setInterval(() => {
    running ??= pass()
      .catch((error: unknown) => {
        const reason = error instanceof Error ? error.message : String(error);
        process.stderr.write(`API: deleting expired idempotency records failed: ${reason}\n`);
      })
      .finally(() => {
        running = undefined;
      });
  }, everyMs);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      stopping.abort();
      await running;
    },
  };
}
