import { randomUUID } from 'node:crypto';
import { withoutCommandValues } from '@idem/core';
import { toBodyBytes, type WebhookBody } from './body.js';
import { contentTypeAsCompared } from './content-type-compare.js';
import { assertDeliverable, headersNotSentAsGiven } from './deliverable.js';
import { WebhookError } from './errors.js';
import type { Queryable } from './queryable.js';

/** An event to deliver, as the business transaction records it. */
export interface OutboxEvent {
  /** The event id (`webhook-id`). Default: a fresh `evt_<uuid>`. */
  id?: string | undefined;
  /**
   * The endpoint. Stored as its href, as fetch parses it (host lower-cased, default port dropped), so
   * that two spellings of one endpoint are one event to `add()` and one URL to the relay.
   */
  url: string | URL;
  /** The exact bytes to send; an object is sent as its JSON. */
  body: WebhookBody | Record<string, unknown>;
  /** Default `application/json`. */
  contentType?: string | undefined;
  /**
   * Extra headers for this event. Names are case-insensitive (sent lower-cased, compared so by
   * `add()`), and one name in two spellings (`X-A` and `x-a`) is refused with a `TypeError`. Values
   * go out (and compare) trimmed; `content-length` (counted from the body), `content-type` (see
   * `contentType`) and the signer's three `webhook-*` headers are a `TypeError`.
   */
  headers?: Record<string, string> | undefined;
}

// SQL lower-casing ASCII letters only, as JavaScript's toLowerCase() does to the names the sender
// sends: lower() follows the database's collation, and a Turkish one turns `I` into a dotless `ı`,
// so `X-ID` and `x-id` (or `Webhook-ID` and the signer's `webhook-id`) would compare as two names.
const asciiUpper = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
const asciiLowered = (text: string) => `translate(${text}, '${asciiUpper}', '${asciiUpper.toLowerCase()}')`;

// SQL for a headers object (jsonb) as the sender sends it, for add() to compare events by. Names
// lower-cased: HTTP field names are case-insensitive (RFC 9110 5.1), and the sender sends them
// lower-cased, so `X-Tenant: a` and `x-tenant: a` are one event. Values without the whitespace around
// them, which fetch trims (RFC 9110 5.5). Without the names that never go out as given: the sender
// drops `content-length`, `contentType` replaces `content-type` and the signer the `webhook-*` three.
// add() refuses all five now, but rows an earlier version stored may hold them, and the relay
// still sends those rows: a producer retrying such an event without them adds nothing.
// Rows keep the headers as the caller spelt them, as every version stored them: a producer of an
// earlier version, during a rolling upgrade, compares them exactly and still finds its own event the
// same. A row that holds one name in two spellings (stored before add() refused them) compares as
// the later in jsonb's key order, the value the relay sends for it.
const sentNotAsGiven = `(${headersNotSentAsGiven.map((name) => `'${name}'`).join(', ')})`;
const namesLowered = (headers: string) =>
  `coalesce((SELECT jsonb_object_agg(${asciiLowered('h.key')}, to_jsonb(btrim(h.value, E' \\t\\r\\n')) ORDER BY h.n)
               FROM jsonb_each_text(${headers}) WITH ORDINALITY AS h(key, value, n)
              WHERE ${asciiLowered('h.key')} NOT IN ${sentNotAsGiven}), '{}'::jsonb)`;

/** The outbox's `add`, for the table `table` (quoted). */
export function createAdd(table: string) {
  const add = async (tx: Queryable, event: OutboxEvent) => {
    if (!tx || typeof tx.query !== 'function') throw new TypeError('add needs the transaction client (with query())');
    if (!event || (typeof event.url !== 'string' && !(event.url instanceof URL))) {
      throw new TypeError('add needs an event with a url');
    }
    const id = event.id ?? `evt_${randomUUID()}`;
    const url = String(event.url);
    // Refused here rather than stored to fail every attempt until the horizon.
    assertDeliverable({ ...event, url, id });
    const raw = event.body;
    const isBytes = typeof raw === 'string' || raw instanceof Uint8Array || raw instanceof ArrayBuffer;
    const json = isBytes ? undefined : JSON.stringify(raw);
    // JSON.stringify gives undefined for undefined, a function or a symbol: there is nothing to send.
    if (!isBytes && json === undefined) throw new TypeError('body must be bytes, a string or a JSON value');
    const body = isBytes ? toBodyBytes(raw) : Buffer.from(json as string, 'utf8');
    // Stored as fetch will parse it (the WHATWG href: host lower-cased, default port dropped, `/` for
    // an empty path), so that two spellings of one endpoint are one event to add() and one URL to the
    // relay's per-URL share, its hold after a 429 and its dead-lettering after a 410.
    const href = new URL(url).href;
    const contentType = event.contentType ?? 'application/json';
    const headers = JSON.stringify(event.headers ?? {});
    const values = [id, href, body, contentType, headers];
    // Without the event's body and headers, which PGlite puts on its errors as `params`.
    const query = (text: string, params: unknown[] = values) =>
      tx.query(text, params).catch((error: unknown) => {
        throw withoutCommandValues(error);
      });
    // A row deleted (purged) between the conflict and the look at it: the id is free again, and the
    // insert is tried again. Twice is enough unless something deletes the id as fast as it comes.
    for (let tries = 0; tries < 3; tries++) {
      const inserted = await query(
        `INSERT INTO ${table} (id, url, body, content_type, headers) VALUES ($1, $2, $3, $4, $5::jsonb)
         ON CONFLICT (id) DO NOTHING`,
      );
      if (inserted.rowCount === 1) return { id, added: true };
      // The id is taken: by this event (a retried producer, the point of the id) or by another one,
      // which `added: false` would lose while the producer believes it queued. An event is its url,
      // bytes, content type and headers (jsonb equality: key order does not count). A second
      // statement, so that under READ COMMITTED it sees a row a concurrent transaction committed
      // while the insert waited on it (the insert's own snapshot does not); under REPEATABLE READ or
      // SERIALIZABLE the insert fails with a serialization error instead. Only the verdict comes back.
      // Headers and content type compare as they will be sent, on both sides (see namesLowered and
      // contentTypeAsCompared). The url matches as stored now (the href) or, for a row an earlier
      // version stored, as the caller spelt it ($5). The content type comes back to be compared here:
      // its parameters (RFC 9110 5.6.6: quoted strings, names in any case) parse better in code than
      // in SQL; nothing else of the row does.
      const { rows } = await query(
        `SELECT (url = $2 OR url = $5) AND body = $3 AND ${namesLowered('headers')} = ${namesLowered('$4::jsonb')} AS same,
                content_type
           FROM ${table} WHERE id = $1`,
        [id, href, body, headers, url],
      );
      if (rows.length === 0) continue;
      if (rows[0].same === true && contentTypeAsCompared(rows[0].content_type) === contentTypeAsCompared(contentType))
        return { id, added: false };
      throw new WebhookError(
        'event_id_reused',
        'The outbox already holds another event (url, body, content type or headers) under this id: give a new event a new id.',
        { details: { id } },
      );
    }
    // Matched on by its code like every other error of the package: nothing was added, and add() in a
    // new transaction may succeed (retryable), where event_id_reused never will.
    throw new WebhookError(
      'event_id_contended',
      'The outbox row of this id was deleted each time add() looked at it; nothing was added.',
      { details: { id } },
    );
  };

  return add;
}
