import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type Duration,
  decoderOf,
  IdempotencyError,
  type IdempotencyEvent,
  principalScope,
  problemResponse,
  problemType,
  readRequestBody,
  type Store,
} from '@idem/core';
import { createInternalVerifier, type LocalJwks, type Principal, requireRoles, requireScopes } from '@idem/guard';
import { authorize, idempotency, internalAuth } from '@idem/koa';
import { postgresStore } from '@idem/postgres';
import { createReceiver, isValidWebhookId, koaWebhook } from '@idem/webhooks';
import Koa, { type Context, type Next } from 'koa';
import type { ServiceChallenge } from '../api/server.js';
import { isUtf8Charset } from '../charset.js';
import type { Database } from '../db.js';
import { dbUnavailable, storeRetryAfterSeconds } from '../db-unavailable.js';
import { drainable } from '../drain.js';
import { htmlPage, pageHeaders } from '../html.js';
import { idempotencyLogger } from '../idempotency-log.js';
import { withOriginForm } from '../request-target.js';
import { apiTables, migrateApi } from '../schema/api-schema.js';
import { hasControlCharacters } from '../text.js';
import { webhookRetention, webhookSchedule } from '../webhook-schedule.js';
import { applyChargeEvent, type ChargeEvent } from './charges.js';
import {
  findReceivedEvent,
  listReceivedEvents,
  type PaymentSucceeded,
  recordApplied,
  recordDelivery,
} from './events.js';
import { addEventNote, listEventNotes } from './notes.js';
import { eventsPage } from './page.js';
import { rejectionLogger } from './rejections.js';

/** Options of {@link startReceiver}. */
export interface ReceiverOptions {
  /** Port (env RECEIVER_PORT, default 8084); 0 for an ephemeral one. */
  port: number;
  /** Interface to bind. Default `127.0.0.1`. */
  host?: string | undefined;
  db: Database;
  /**
   * The caller already ran `migrateApi` on `db` (as `startResourceStack` does before it starts the
   * receiver and the API): not run again. Default false: the tables are made (or checked) here.
   */
  schemaReady?: boolean | undefined;
  /** The Standard Webhooks secret the API signs with (`whsec_...`). */
  webhookSecret: string;
  /** Where events are posted. Default `/webhooks/payments`. */
  path?: string | undefined;
  /** Clock of the signature tolerance and of the internal-token checks, epoch ms. */
  now?: (() => number) | undefined;
  /**
   * The gateway's internal tokens, for the admin API under {@link receiverAdminPrefix}. Without it
   * the admin API answers 404: there is nobody it could trust.
   */
  internal?:
    | { issuer: string; audience: string; jwks: LocalJwks; challenge?: ServiceChallenge | undefined }
    | undefined;
  /**
   * Told every idempotency event of the admin API's keyed route (`POST /webhook-events/<id>/notes`),
   * with its record id, never the key. Default: one line on stderr, `receiver: idempotency ...`, for
   * each event an operator should look at (a store error, a claim that took over a crashed attempt,
   * ...; see {@link idempotencyLogger}), nothing for a claim, a replay or a completion.
   */
  onIdempotencyEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /**
   * Told a line about webhook deliveries the receiver refused (a wrong secret, a body changed on the
   * way, a clock far off): the first at once, then at most one a minute with how many of each code
   * came in (see {@link rejectionLogger}). Default: on stderr.
   */
  onRejectedDeliveries?: ((line: string) => void) | undefined;
  /**
   * The lease of the inbox's claim on an event id while it is applied, and of the notes route's keys.
   * Default the core's, `'10s'`.
   */
  idempotencyLease?: Duration | undefined;
}

/** Where the receiver's admin API lives; the gateway forwards this prefix to the receiver. */
export const receiverAdminPrefix = '/webhook-events';

/** A running receiver. */
export interface RunningReceiver {
  /** `http://localhost:<port>`. */
  readonly url: string;
  /** The events page with its token: `http://localhost:<port>/?token=...`. */
  readonly pageUrl: string;
  /** The endpoint to give the API's sender. */
  readonly webhookUrl: string;
  close(): Promise<void>;
}

/**
 * Starts the webhook receiver on Koa. `POST /webhooks/payments` verifies the Standard Webhooks
 * signature, then goes through the inbox (`createReceiver` on the transactional PostgreSQL/PGlite
 * store): the first delivery of an event id applies it in the same transaction that records the id;
 * any later delivery is acknowledged without applying. Applying sets the charge's state only if the
 * event is newer than the state it holds (see {@link applyChargeEvent}): events may arrive out of
 * order. `GET /` is the demo page listing the events
 * with their delivery and apply counts, for whoever holds its link with the page token (403 without);
 * the same as JSON is the admin API (see {@link adminApi}), reached through the gateway.
 *
 * @example
 * ```ts
 * const receiver = await startReceiver({ port: 8084, db, webhookSecret: await loadWebhookSecret(db) });
 * console.log(receiver.webhookUrl); // http://localhost:8084/webhooks/payments
 * console.log(receiver.pageUrl); // http://localhost:8084/?token=...
 * ```
 */
export async function startReceiver(options: ReceiverOptions): Promise<RunningReceiver> {
  const { db } = options;
  const path = options.path ?? '/webhooks/payments';
  // The events page (`GET /`) lists payments: it answers only the link `npm start` prints
  // (`pageUrl`, with this token, new on every start); any other request for it is 403.
  const pageToken = randomBytes(32).toString('base64url');
  // Compared as digests: equal lengths for timingSafeEqual, and no timing tells how much of a guess matched.
  const pageTokenDigest = createHash('sha256').update(pageToken).digest();
  const holdsPageToken = (given: unknown) =>
    typeof given === 'string' && timingSafeEqual(createHash('sha256').update(given).digest(), pageTokenDigest);
  if (!options.schemaReady) await migrateApi(db);
  // Delivery counts are written after the inbox answered; the response waits for them, so the page
  // is up to date by the time the sender sees its acknowledgement.
  const pendingCounts = new Set<Promise<void>>();
  const rejections = rejectionLogger({
    write: options.onRejectedDeliveries ?? ((line) => process.stderr.write(`${line}\n`)),
    ...(options.now ? { now: options.now } : {}),
  });
  const receiver = createReceiver({
    store: postgresStore({ client: db.client, table: apiTables.receiverInbox }),
    secret: options.webhookSecret,
    // Longer than the API sender keeps retrying: its latest retry is still recognised.
    retention: webhookRetention,
    senderHorizon: webhookSchedule.horizon,
    scope: 'reference-api',
    // The event's own row, and its charge's state behind a version guard (events arrive out of
    // order); both in the inbox's transaction, so they commit with the record of the event id.
    apply: async (event, tx) => {
      const executor = tx as Parameters<typeof recordApplied>[0];
      const payload = event.json<PaymentSucceeded & ChargeEvent>();
      await recordApplied(executor, event.id, payload);
      await applyChargeEvent(executor, event.id, payload);
    },
    ...(options.now ? { now: options.now } : {}),
    ...(options.idempotencyLease === undefined ? {} : { lease: options.idempotencyLease }),
    onEvent: (event) => {
      if (event.type === 'rejected') {
        rejections.note(event);
        return;
      }
      if (event.type === 'record-failed' || event.id === undefined) return;
      const counted = recordDelivery(db, event.id).catch(() => undefined);
      pendingCounts.add(counted);
      void counted.finally(() => pendingCounts.delete(counted));
    },
  });
  const webhook = koaWebhook(receiver, { path, limit: 64 * 1024 });

  const app = new Koa();
  app.use(databaseErrors);
  app.use(async (ctx, next) => {
    if ((ctx.method === 'GET' || ctx.method === 'HEAD') && ctx.path === '/') {
      ctx.set(pageHeaders);
      // The loopback bind alone would let any local process, or a page in the browser that rebinds a
      // DNS name to 127.0.0.1, read the payments: the page wants its token.
      if (!holdsPageToken(ctx.query.token)) {
        ctx.status = 403;
        ctx.body = htmlPage(
          'Webhook receiver',
          '<h1>Webhook receiver</h1>\n<p>Open this page with the link <code>npm start</code> printed: it carries the page token.</p>',
        );
        return;
      }
      ctx.body = eventsPage(await listReceivedEvents(db), {
        token: String(ctx.query.token),
        refresh: ctx.query.refresh !== 'off',
      });
      return;
    }
    await next();
  });
  if (options.internal) {
    const verifier = createInternalVerifier({
      issuer: options.internal.issuer,
      audience: options.internal.audience,
      jwks: options.internal.jwks,
      ...options.internal.challenge,
      ...(options.now ? { now: options.now } : {}),
    });
    await verifier.ready();
    const store = postgresStore({ client: db.client, table: apiTables.plainIdempotency });
    app.use(
      adminApi(db, {
        authenticate: internalAuth(verifier),
        // The role says who the user is; the scope says the user let this client act as an admin here.
        read: authorize(requireScopes('events:read'), requireRoles('admin')),
        write: authorize(requireScopes('events:write'), requireRoles('admin')),
        store,
        // The operators' trail, as the API's: without it a note's 503 leaves nothing to follow.
        onEvent: options.onIdempotencyEvent ?? idempotencyLogger('receiver'),
        ...(options.idempotencyLease === undefined ? {} : { lease: options.idempotencyLease }),
      }),
    );
  }
  app.use(async (ctx, next) => {
    // Koa's Request declares no `body` (a body parser adds it), so TypeScript's weak-type check refuses
    // it for KoaLikeContext's optional one; the shape is what koaWebhook reads.
    await webhook(ctx as unknown as Parameters<typeof webhook>[0], next);
    await Promise.all(pendingCounts);
  });
  app.use((ctx) => {
    if (ctx.path === path) refuseMethod(ctx, ['POST']);
    else if (ctx.path === '/') refuseMethod(ctx, ['GET', 'HEAD']);
    else sendProblem(ctx, 404, 'route_not_found', 'No such resource', `Events are posted to ${path}.`);
  });

  const server = createServer(withOriginForm(app.callback(), 'problem'));
  const drain = drainable(server);
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
    pageUrl: `${url}/?token=${encodeURIComponent(pageToken)}`,
    webhookUrl: `${url}${path}`,
    async close() {
      await drain.close();
      rejections.flush();
    },
  };
}

type KoaMiddleware = (ctx: Context, next: Next) => Promise<unknown> | unknown;

/** Runs `chain` in order, then `last`; any link that answers without calling next ends it. */
function runChain(chain: readonly KoaMiddleware[], last: (ctx: Context) => Promise<void>) {
  return (ctx: Context): Promise<unknown> => {
    const step = async (index: number): Promise<unknown> => {
      const link = chain[index];
      return link ? link(ctx, () => step(index + 1) as Promise<void>) : last(ctx);
    };
    return step(0);
  };
}

/**
 * The receiver's one answer to a database that could not answer (see {@link dbUnavailable}), on any
 * route: DESIGN.md's HTTP table makes it a 503 with Retry-After, never Koa's 500. The events page, a
 * browser's, gets a page; every other route a problem. Anything else goes on to Koa (a bug: 500).
 */
async function databaseErrors(ctx: Context, next: Next): Promise<void> {
  try {
    await next();
  } catch (error) {
    if (!dbUnavailable(error) || ctx.headerSent) throw error;
    ctx.set('Retry-After', String(storeRetryAfterSeconds));
    if ((ctx.method === 'GET' || ctx.method === 'HEAD') && ctx.path === '/') {
      ctx.status = 503;
      ctx.set(pageHeaders);
      ctx.body = htmlPage(
        'Webhook receiver',
        '<h1>Webhook receiver</h1>\n<p>The receiver could not reach its database. Try again in a moment.</p>',
      );
      return;
    }
    sendProblem(
      ctx,
      503,
      'database_unavailable',
      'The database is unavailable',
      'The database could not be reached; send the request again later.',
      true,
    );
  }
}

function notFound(ctx: Context, detail: string): void {
  sendProblem(ctx, 404, 'event_not_found', 'No such event', detail);
}

/**
 * An `application/problem+json` answer (RFC 9457), never cached, with its stable `code`; `retryable`
 * when the same request sent again may succeed.
 */
function sendProblem(
  ctx: Context,
  status: number,
  code: string,
  title: string,
  detail: string,
  retryable = false,
): void {
  ctx.status = status;
  ctx.set('Cache-Control', 'no-store');
  ctx.type = 'application/problem+json';
  ctx.body = JSON.stringify({
    type: problemType(code),
    title,
    status,
    detail,
    code,
    retryable,
  });
}

/** What {@link adminApi} runs before its routes, and where it keeps the notes' idempotency keys. */
export interface AdminApiOptions {
  /** `internalAuth()` of `@idem/koa`: only the gateway's internal token for this receiver gets in. */
  authenticate: KoaMiddleware;
  /** The authorization of the reads (`GET`), after `authenticate`. */
  read: KoaMiddleware;
  /** The authorization of adding a note (`POST .../notes`), after `authenticate`. */
  write: KoaMiddleware;
  /** Where the notes' `Idempotency-Key`s live. */
  store: Store;
  /** Told the idempotency events of the notes route (the receiver's `onIdempotencyEvent`). */
  onEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /** The lease of the notes route's keys (the receiver's `idempotencyLease`). Default the core's, `'10s'`. */
  lease?: Duration | undefined;
}

/** Largest note, in characters. */
const maxNoteLength = 500;

/** The title of a 415, as the API's. */
const unsupportedTitle = 'The body is not in a supported format';

/** Largest note body, in bytes. */
const maxNoteBodyBytes = 16 * 1024;

/**
 * The receiver's admin API on Koa, for operators through the gateway: `GET /webhook-events` lists
 * every event with its delivery and apply counts, `GET /webhook-events/<id>` shows one with its notes,
 * and `POST /webhook-events/<id>/notes` (`{ "text": "..." }`) adds a note. The receiver wires
 * `authenticate` as `internalAuth()` (a direct call without the gateway's internal token is 401),
 * `read` as `authorize(requireScopes('events:read'), requireRoles('admin'))` and `write` as the same
 * with `events:write` (403 otherwise): the admin role works only from a token the user consented to
 * use it with. An id no event can have (not a `webhook-id`) is 404, like an id never seen.
 *
 * Adding a note is not idempotent by itself (each POST adds one), so it runs behind `@idem/koa`'s
 * `idempotency()`: an operator's retry with the same `Idempotency-Key` gets the first note back
 * instead of a second copy. Keys are scoped to the admin the internal token names and to the client
 * acting for them. A note is 1 to 500 characters with no control characters but tab and line feed
 * (422 otherwise), sent as `application/json` in UTF-8 (415 otherwise); its body may come gzip,
 * deflate or br coded (415 for another coding, 400 for bytes that do not decode), all refused before
 * the key is claimed.
 *
 * @example
 * ```ts
 * app.use(
 *   adminApi(db, {
 *     authenticate: internalAuth(verifier),
 *     read: authorize(requireScopes('events:read'), requireRoles('admin')),
 *     write: authorize(requireScopes('events:write'), requireRoles('admin')),
 *     store,
 *   }),
 * );
 * ```
 */
export function adminApi(db: Database, options: AdminApiOptions): KoaMiddleware {
  const read = runChain([options.authenticate, options.read], async (ctx) => {
    ctx.set('Cache-Control', 'no-store');
    if (ctx.path === receiverAdminPrefix) {
      ctx.body = { events: await listReceivedEvents(db, 1000) };
      return;
    }
    const id = eventIdOf(ctx.path);
    const event = id ? await findReceivedEvent(db, id) : undefined;
    if (!event) notFound(ctx, 'The receiver has seen no event with this id.');
    else ctx.body = { ...event, notes: await listEventNotes(db, event.id) };
  });
  const writeChain = [
    options.authenticate,
    options.write,
    // Before the key is claimed, as for charges: an invalid note must not use up the key, so the
    // operator's corrected retry with it adds the note instead of getting 422.
    validNote,
    idempotency({
      store: options.store,
      maxBodyBytes: maxNoteBodyBytes,
      scope: (ctx) => principalScope((ctx.state as { auth?: Principal }).auth, { perClient: true }),
      ...(options.onEvent ? { onEvent: options.onEvent } : {}),
      ...(options.lease === undefined ? {} : { lease: options.lease }),
    }),
  ];
  const write = runChain(writeChain, async (ctx) => {
    const id = eventIdOf(ctx.path.slice(0, -'/notes'.length));
    const event = id ? await findReceivedEvent(db, id) : undefined;
    if (!event) {
      notFound(ctx, 'The receiver has seen no event with this id.');
      return;
    }
    // validNote answers every request it does not set a note for, so this never runs without one. An
    // empty text in its place would add a note the route refuses (1 to 500 characters): a bug that let
    // a request past validNote fails here, as a 500, and adds nothing.
    const text = (ctx.state as { note?: unknown }).note;
    if (typeof text !== 'string')
      throw new Error('receiver notes: a request reached the handler without a checked note');
    const author = (ctx.state as { auth?: { sub?: string } }).auth?.sub ?? 'unknown';
    ctx.status = 201;
    // The same on every run of this request, a run after a crash too: that run answers the note the
    // killed one added (see addEventNote).
    const requestKey = (ctx.state as { idempotency?: { keyFor(purpose: string): string } }).idempotency?.keyFor('note');
    ctx.body = await addEventNote(db, event.id, author, text.trim(), requestKey);
  });
  // A path of the admin API with a method it does not take: 405, once the caller is authenticated.
  const refuse = (allow: readonly string[]) =>
    runChain([options.authenticate], async (ctx) => refuseMethod(ctx, allow));
  const refuseRead = refuse(['GET', 'HEAD']);
  const refuseWrite = refuse(['POST']);
  return async (ctx, next) => {
    const route = adminRouteOf(ctx.path);
    if (!route) return next();
    if (route === 'notes') return ctx.method === 'POST' ? write(ctx) : refuseWrite(ctx);
    return ctx.method === 'GET' || ctx.method === 'HEAD' ? read(ctx) : refuseRead(ctx);
  };
}

/**
 * Which route of the admin API `path` has the shape of: the list, one event, or one event's notes.
 * The id is checked by the route itself (an impossible one is 404, like an unknown one).
 */
function adminRouteOf(path: string): 'list' | 'event' | 'notes' | undefined {
  if (path === receiverAdminPrefix) return 'list';
  if (!path.startsWith(`${receiverAdminPrefix}/`)) return undefined;
  const rest = path.slice(receiverAdminPrefix.length + 1).split('/');
  if (rest.length === 1) return 'event';
  return rest.length === 2 && rest[1] === 'notes' ? 'notes' : undefined;
}

/**
 * Refuses a method the path does not take: 405 problem+json with `Allow` (RFC 9110 section 15.5.6);
 * `OPTIONS` gets 204 with the same `Allow`.
 */
function refuseMethod(ctx: Context, methods: readonly string[]): void {
  const allow = [...methods, 'OPTIONS'].join(', ');
  ctx.set('Allow', allow);
  if (ctx.method === 'OPTIONS') {
    ctx.status = 204;
    return;
  }
  sendProblem(ctx, 405, 'method_not_allowed', 'Method not allowed', `This resource takes ${allow}.`);
}

/**
 * The note's bytes with its Content-Encoding undone; `unsupported` for a coding (or a list of them)
 * not taken here, `undecodable` for bytes that do not decode from it, `too-large` for bytes that
 * decode past the limit.
 */
function decodedNote(bytes: Buffer, encoding: string): Buffer | 'unsupported' | 'undecodable' | 'too-large' {
  const coding = encoding.trim().toLowerCase();
  if (coding === '' || coding === 'identity') return bytes;
  const decode = decoderOf(coding);
  if (decode === undefined) return 'unsupported';
  try {
    return decode(bytes, { maxOutputLength: maxNoteBodyBytes });
  } catch (error) {
    return (error as { code?: unknown }).code === 'ERR_BUFFER_TOO_LARGE' ? 'too-large' : 'undecodable';
  }
}

/**
 * Answers 415 unless the note comes as `application/json` in UTF-8; then reads its body and answers
 * 422 unless it is a JSON object whose `text`, trimmed, is 1 to {@link maxNoteLength} characters
 * without control characters but tab and line feed; a valid text goes to `ctx.state.note`. The bytes are put back into the stream, so the idempotency middleware
 * after it fingerprints them as they came. A body it cannot read (over the limit, or cut short) is
 * answered here too, as the idempotency middleware answers it (413 `body_too_large`, 400
 * `body_incomplete`): nothing goes on without a checked note.
 */
async function validNote(ctx: Context, next: Next): Promise<unknown> {
  // JSON in UTF-8, as the API's routes take it: a form, plain text or another charset is not read as
  // a note (it would be decoded as UTF-8 whatever it said it was).
  if (!ctx.is('application/json')) {
    sendProblem(ctx, 415, 'unsupported_media_type', unsupportedTitle, 'Send the body as application/json.');
    return;
  }
  if (!isUtf8Charset(ctx.get('content-type'))) {
    sendProblem(
      ctx,
      415,
      'unsupported_media_type',
      unsupportedTitle,
      'Send the body as JSON in UTF-8 (application/json; charset=utf-8).',
    );
    return;
  }
  const body = await readRequestBody(ctx.req, maxNoteBodyBytes);
  // Not left to the idempotency middleware: a chunked body read past the limit is drained, and that
  // middleware's own read then finds a body that ended (or its tail), takes it, and the handler ran
  // without a note.
  if (!body.ok) return answerError(ctx, body.error);
  // A compressed note is read as its text. A coding we do not take, or bytes that do not decode, are
  // refused here, before the key is claimed: the middleware fingerprints such a body as it came and
  // answers nothing, and no parser after it would refuse it.
  const bytes = body.body ? decodedNote(body.body, ctx.get('content-encoding')) : undefined;
  if (bytes === 'too-large') {
    return answerError(
      ctx,
      new IdempotencyError('body_too_large', `The request body is larger than ${maxNoteBodyBytes} bytes.`),
    );
  }
  if (bytes === 'unsupported') {
    sendProblem(
      ctx,
      415,
      'unsupported_media_type',
      unsupportedTitle,
      'The Content-Encoding is not supported; send identity, gzip, deflate or br.',
    );
    return;
  }
  if (bytes === 'undecodable') {
    sendProblem(
      ctx,
      400,
      'body_malformed',
      'The body could not be read',
      'The body does not decode from its Content-Encoding.',
    );
    return;
  }
  let parsed: unknown;
  try {
    // An empty body is no note (422), as the API's parser reads it.
    parsed = bytes && bytes.length > 0 ? JSON.parse(bytes.toString('utf8')) : undefined;
  } catch {
    // Not JSON at all is a malformed body (400), as the API answers it; JSON of another shape, or a
    // note out of bounds, is the 422 below.
    sendProblem(ctx, 400, 'body_malformed', 'The body could not be read', 'The body is not valid JSON.');
    return;
  }
  const text =
    typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
      ? (parsed as { text?: unknown }).text
      : undefined;
  // The length is the stored note's, trimmed, as a photo title's is.
  const kept = typeof text === 'string' ? text.trim() : '';
  if (
    typeof text !== 'string' ||
    kept.length === 0 ||
    kept.length > maxNoteLength ||
    hasControlCharacters(text, { allowLines: true })
  ) {
    sendProblem(
      ctx,
      422,
      'validation_failed',
      'Invalid note',
      `A note is a JSON object with a "text" of 1 to ${maxNoteLength} characters, without control characters but tab and line feed.`,
    );
    return;
  }
  (ctx.state as { note?: string }).note = text;
  return next();
}

/** Answers `error` with the very bytes the idempotency middleware answers it with. */
function answerError(ctx: Context, error: IdempotencyError): void {
  const response = problemResponse(error);
  ctx.status = response.status;
  ctx.set(response.headers);
  ctx.body = Buffer.from(response.body);
}

/** The event id in an admin path, or '' when it is not one a `webhook-id` (and so an event) can have. */
function eventIdOf(path: string): string {
  let id: string;
  try {
    id = decodeURIComponent(path.slice(receiverAdminPrefix.length + 1));
  } catch {
    return '';
  }
  return isValidWebhookId(id) ? id : '';
}
