// outbox.add() compares an event with the one it holds under the id as the relay will SEND them, not
// as they were spelt. What the sender drops or overrides, and what fetch trims, cannot make two
// events differ on the wire, so a producer that retries with such a difference must get
// `added: false`, not `event_id_reused`:
// (a) a `content-length` header in a row an earlier version stored: the sender never sends it (fetch
//     counts the body itself; add() now refuses it with a TypeError, signer-headers.int.test.ts);
// (b) a `content-type` (or `webhook-id`, `webhook-timestamp`, `webhook-signature`) header in a row
//     an earlier version stored: the event's `contentType` and the signer's headers replace it (add()
//     now refuses these names with a TypeError, signer-headers.int.test.ts, so only old rows hold them);
// (c) leading and trailing whitespace of a header value or of `contentType`: fetch trims it (HTTP
//     field values carry no outer whitespace, RFC 9110 5.5);
// (d) the case of the media type in `contentType` (`Application/JSON`): type and subtype are
//     case-insensitive (RFC 9110 8.3.1). This one is not byte-for-byte the same on the wire (the
//     stored spelling goes out), but no receiver may read the two differently;
// (e) so too the spelling of its parameters (RFC 9110 5.6.6): names in any case, whitespace around
//     `;`, a value quoted or not, the `charset` value in any case. Other values stay as written:
//     they may be case-sensitive (a `profile` URL).
// Rows keep the event as the caller spelt it, as every version stored them: a producer of the
// version before, during a rolling upgrade, compares the row exactly and must still find its own
// event the same. Rows such a version wrote compare the same way, normalised on both sides.
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createOutbox, createSender, isWebhookError, type Outbox, type OutboxEvent } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox add as sent');

describe.skipIf(!available)('outbox.add compares events as the relay sends them', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_as_sent');
  const outbox: Outbox = createOutbox({ table });
  const event: OutboxEvent = { id: 'evt_1', url: 'https://receiver.test/hooks', body: '{"n":1}' };
  const reused = (error: unknown) => isWebhookError(error) && error.code === 'event_id_reused';
  const addBoth = async (first: Partial<OutboxEvent>, second: Partial<OutboxEvent>) => {
    await pool.query(`DELETE FROM "${table}"`);
    expect(await outbox.add(pool, { ...event, ...first })).toEqual({ id: 'evt_1', added: true });
    return outbox.add(pool, { ...event, ...second }).catch((caught: unknown) => caught);
  };
  /** The same event in two spellings, each added first: both orders must find the other the same. */
  const same = async (one: Partial<OutboxEvent>, other: Partial<OutboxEvent>) => {
    expect(await addBoth(one, other), JSON.stringify([one, other])).toEqual({ id: 'evt_1', added: false });
    expect(await addBoth(other, one), JSON.stringify([other, one])).toEqual({ id: 'evt_1', added: false });
  };
  const different = async (one: Partial<OutboxEvent>, other: Partial<OutboxEvent>) => {
    expect(reused(await addBoth(one, other)), JSON.stringify([one, other])).toBe(true);
    expect(reused(await addBoth(other, one)), JSON.stringify([other, one])).toBe(true);
  };
  /** A row as a version before this one wrote it: the event exactly as the caller spelt it. */
  const writtenByEarlierVersion = (contentType: string, headers: Record<string, string>) =>
    pool.query(
      `INSERT INTO "${table}" (id, url, body, content_type, headers) VALUES ('evt_1', $1, convert_to('{"n":1}', 'UTF8'), $2, $3::jsonb)`,
      [event.url, contentType, JSON.stringify(headers)],
    );

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${table}"`);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  /** add() of `second` over a row an earlier version wrote: the outcome, or what it threw. */
  const overEarlierRow = async (contentType: string, headers: Record<string, string>, second: Partial<OutboxEvent>) => {
    await pool.query(`DELETE FROM "${table}"`);
    await writtenByEarlierVersion(contentType, headers);
    return outbox.add(pool, { ...event, ...second }).catch((caught: unknown) => caught);
  };

  it('(a) a content-length header in an earlier row, which the sender never sends, makes no other event', async () => {
    const same = { id: 'evt_1', added: false };
    expect(await overEarlierRow('application/json', { 'Content-Length': '7' }, {})).toEqual(same);
    expect(
      await overEarlierRow(
        'application/json',
        { 'x-tenant': 'a', 'content-length': '999' },
        { headers: { 'x-tenant': 'a' } },
      ),
    ).toEqual(same);
    // The headers that go out are still compared.
    expect(
      reused(
        await overEarlierRow(
          'application/json',
          { 'x-tenant': 'a', 'content-length': '999' },
          { headers: { 'x-tenant': 'b' } },
        ),
      ),
    ).toBe(true);
  });

  it('(b) a content-type header in an earlier row, which contentType replaces, makes no other event', async () => {
    const same = { id: 'evt_1', added: false };
    expect(await overEarlierRow('application/json', { 'Content-Type': 'text/plain' }, {})).toEqual(same);
    expect(await overEarlierRow('text/csv', { 'content-type': 'text/plain' }, { contentType: 'text/csv' })).toEqual(
      same,
    );
    // The content type that goes out is still compared.
    expect(
      reused(await overEarlierRow('application/json', { 'content-type': 'text/csv' }, { contentType: 'text/csv' })),
    ).toBe(true);
  });

  it('(b) nor does a webhook-* header in an earlier row, which the signer replaces', async () => {
    const signers = { 'Webhook-Id': 'other', 'webhook-timestamp': '1', 'webhook-signature': 'v1,x' };
    expect(await overEarlierRow('application/json', signers, {})).toEqual({ id: 'evt_1', added: false });
    // Only those three: another webhook-* name goes out as given, so it counts.
    await different({}, { headers: { 'webhook-tenant': 'a' } });
  });

  it('(c) whitespace around a header value or the content type, which fetch trims, makes no other event', async () => {
    await same({ headers: { 'x-tenant': 'a' } }, { headers: { 'x-tenant': ' a\t' } });
    await same({ contentType: 'text/csv' }, { contentType: '  text/csv ' });
    // Inside a value it counts.
    await different({ headers: { 'x-tenant': 'a b' } }, { headers: { 'x-tenant': 'a  b' } });
  });

  it('(d) the media type in another case is the same event; a parameter value in another case is not', async () => {
    await same({}, { contentType: 'Application/JSON' });
    await same(
      { contentType: 'application/json; profile="https://schemas.test/Order"' },
      { contentType: 'APPLICATION/JSON; profile="https://schemas.test/Order"' },
    );
    await different(
      { contentType: 'application/json; profile="https://schemas.test/Order"' },
      { contentType: 'application/json; profile="https://schemas.test/order"' },
    );
    await different({ contentType: 'application/json' }, { contentType: 'application/cloudevents+json' });
  });

  // Was wrong: the media type was compared in any case, its parameters byte for byte. RFC 9110 8.3.1
  // and 5.6.6: parameter names are case-insensitive, so is the charset value, whitespace around `;`
  // is optional, and a value quoted or not is one value.
  it('(e) parameters in another spelling of one value are the same event; another value is not', async () => {
    await same({ contentType: 'application/json; charset=UTF-8' }, { contentType: 'application/json;charset=utf-8' });
    await same({ contentType: 'text/plain;charset=utf-8' }, { contentType: 'Text/Plain ; Charset="UTF-8"' });
    await same(
      { contentType: 'application/json; profile="https://schemas.test/Order"; charset=utf-8' },
      { contentType: 'application/json;PROFILE="https://schemas.test/Order";charset="utf-8"' },
    );
    await same({ contentType: 'text/plain; format=flowed' }, { contentType: 'text/plain;format="flowed"' });
    await same({ contentType: 'text/plain; x="a\\"b"' }, { contentType: 'text/plain;x="a\\"b"' });
    // Another value of a case-sensitive parameter, another charset, or a parameter more is another event.
    await different({ contentType: 'text/plain; format=flowed' }, { contentType: 'text/plain; format=Flowed' });
    await different({ contentType: 'text/plain; charset=utf-8' }, { contentType: 'text/plain; charset=iso-8859-1' });
    await different({ contentType: 'text/plain' }, { contentType: 'text/plain; charset=utf-8' });
    await different({ contentType: 'text/plain; a=1; b=2' }, { contentType: 'text/plain; a=1' });
  });

  it('(e) parameters of a row an earlier version wrote compare as they mean too', async () => {
    expect(
      await overEarlierRow('Application/JSON ;Charset="UTF-8"', {}, { contentType: 'application/json; charset=utf-8' }),
    ).toEqual({ id: 'evt_1', added: false });
  });

  it('stores the event as the caller spelt it, which a producer of the version before compares exactly', async () => {
    const headers = { 'X-Tenant': ' a ', 'Accept-Language': 'EN' };
    await outbox.add(pool, { ...event, contentType: 'Application/JSON', headers });
    const { rows } = await pool.query(
      `SELECT content_type = $1 AND headers = $2::jsonb AS same FROM "${table}" WHERE id = 'evt_1'`,
      ['Application/JSON', JSON.stringify(headers)],
    );
    expect(rows).toEqual([{ same: true }]);
  });

  it('a row an earlier version wrote compares as it will be sent', async () => {
    await writtenByEarlierVersion(' Application/JSON', {
      'X-Tenant': ' a ',
      'Content-Length': '7',
      'Content-Type': 'x/y',
    });
    expect(await outbox.add(pool, { ...event, headers: { 'x-tenant': 'a' } })).toEqual({ id: 'evt_1', added: false });
    const error = await outbox.add(pool, { ...event, headers: { 'x-tenant': 'b' } }).catch((caught) => caught);
    expect(reused(error)).toBe(true);
  });

  // The decisions above rest on what goes out: (a), (b) and (c) are sent byte for byte the same.
  it('the spellings (a) to (c) count as one reach the receiver as the same request', async () => {
    const received: IncomingHttpHeaders[] = [];
    const server = createServer((request, response) => {
      received.push(request.headers);
      request.resume();
      response.writeHead(204).end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
      const sender = createSender({ secret: SECRET, timeout: '5s', random: () => 0, now: () => 1_700_000_000_000 });
      await sender.send({ id: 'evt_1', url, body: '{"n":1}', contentType: 'text/csv', headers: { 'x-tenant': 'a' } });
      // attempt(), the relay's path: (b) is what an earlier version's row holds, which send() refuses.
      await sender.attempt(
        {
          id: 'evt_1',
          url,
          body: '{"n":1}',
          contentType: ' text/csv ',
          headers: { 'X-Tenant': ' a\t', 'Content-Length': '999', 'Content-Type': 'text/plain', 'Webhook-Id': 'other' },
        },
        1,
      );
      expect(received).toHaveLength(2);
      expect(received[1]).toEqual(received[0]);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});
