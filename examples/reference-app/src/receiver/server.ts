import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { postgresStore } from '@idem/postgres';
import { createReceiver, koaWebhook } from '@idem/webhooks';
import Koa from 'koa';
import type { Database } from '../db.js';
import { pageHeaders } from '../html.js';
import { apiTables, migrateApi } from '../schema/api-schema.js';
import { listReceivedEvents, type PaymentSucceeded, recordApplied, recordDelivery } from './events.js';
import { eventsPage } from './page.js';

/** Options of {@link startReceiver}. */
export interface ReceiverOptions {
  /** Port (env RECEIVER_PORT, default 8084); 0 for an ephemeral one. */
  port: number;
  /** Interface to bind. Default `127.0.0.1`. */
  host?: string;
  db: Database;
  /** The Standard Webhooks secret the API signs with (`whsec_...`). */
  webhookSecret: string;
  /** Where events are posted. Default `/webhooks/payments`. */
  path?: string;
  /** Clock of the signature tolerance, epoch ms. */
  now?: () => number;
}

/** A running receiver. */
export interface RunningReceiver {
  /** `http://localhost:<port>`: the events page. */
  readonly url: string;
  /** The endpoint to give the API's sender. */
  readonly webhookUrl: string;
  close(): Promise<void>;
}

/**
 * Starts the webhook receiver on Koa. `POST /webhooks/payments` verifies the Standard Webhooks
 * signature, then goes through the inbox (`createReceiver` on the transactional PostgreSQL/PGlite
 * store): the first delivery of an event id applies it in the same transaction that records the id;
 * any later delivery is acknowledged without applying. `GET /` lists the events with their delivery
 * and apply counts; `GET /events.json` is the same as JSON.
 *
 * @example
 * ```ts
 * const receiver = await startReceiver({ port: 8084, db, webhookSecret: await loadWebhookSecret(db) });
 * console.log(receiver.webhookUrl); // http://localhost:8084/webhooks/payments
 * ```
 */
export async function startReceiver(options: ReceiverOptions): Promise<RunningReceiver> {
  const { db } = options;
  const path = options.path ?? '/webhooks/payments';
  await migrateApi(db);
  // Delivery counts are written after the inbox answered; the response waits for them, so the page
  // is up to date by the time the sender sees its acknowledgement.
  const pendingCounts = new Set<Promise<void>>();
  const receiver = createReceiver({
    store: postgresStore({ client: db.client, table: apiTables.receiverInbox }),
    secret: options.webhookSecret,
    // Longer than the API sender's 24-hour horizon: a late retry is still recognised.
    retention: '72h',
    senderHorizon: '24h',
    scope: 'reference-api',
    apply: (event, tx) =>
      recordApplied(tx as Parameters<typeof recordApplied>[0], event.id, event.json<PaymentSucceeded>()),
    ...(options.now ? { now: options.now } : {}),
    onEvent: (event) => {
      if (event.type === 'rejected' || event.type === 'record-failed' || event.id === undefined) return;
      const counted = recordDelivery(db, event.id).catch(() => undefined);
      pendingCounts.add(counted);
      void counted.finally(() => pendingCounts.delete(counted));
    },
  });
  const webhook = koaWebhook(receiver, { path, limit: 64 * 1024 });

  const app = new Koa();
  app.use(async (ctx, next) => {
    if (ctx.method === 'GET' && (ctx.path === '/' || ctx.path === '/events.json')) {
      const events = await listReceivedEvents(db);
      if (ctx.path === '/events.json') {
        ctx.set('Cache-Control', 'no-store');
        ctx.body = { events };
        return;
      }
      ctx.set(pageHeaders);
      ctx.body = eventsPage(events);
      return;
    }
    await next();
  });
  app.use(async (ctx, next) => {
    // Koa's Request declares no `body` (a body parser adds it), so TypeScript's weak-type check refuses
    // it for KoaLikeContext's optional one; the shape is what koaWebhook reads.
    await webhook(ctx as unknown as Parameters<typeof webhook>[0], next);
    await Promise.all(pendingCounts);
  });
  app.use((ctx) => {
    ctx.status = 404;
    ctx.type = 'application/problem+json';
    ctx.body = JSON.stringify({
      type: 'https://idem.dev/problems/route-not-found',
      title: 'No such resource',
      status: 404,
      detail: `Events are posted to ${path}; the list is at /.`,
      code: 'route_not_found',
      retryable: false,
    });
  });

  const server = createServer(app.callback());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const url = `http://localhost:${port}`;
  return {
    url,
    webhookUrl: `${url}${path}`,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}
