// outbox.add() refuses the signer's three headers and a content-type in `headers` with a TypeError,
// as sender.send() does: the relay replaced them in silence. Rows an earlier version stored with them
// must still go out: the relay's attempt() does not re-check what add() let in, and sends such a row
// with the signer's headers and the row's content type, signed so that a receiver verifies it.
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import vm from 'node:vm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, createVerifier, type OutboxEvent } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('signer headers');

describe.skipIf(!available)("outbox and the signer's headers", () => {
  const pool = testPool();
  const table = uniqueTable('signer_headers');
  const outbox = createOutbox({ table });
  const event: OutboxEvent = { url: 'https://receiver.test/hooks', body: '{"n":1}' };

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  const refused: [name: string, value: string][] = [
    ['Webhook-Id', 'other'],
    ['webhook-timestamp', '1'],
    ['WEBHOOK-SIGNATURE', 'v1,x'],
    ['Content-Type', 'text/plain'],
    // Was wrong: stored, and dropped by the relay in silence.
    ['Content-Length', '7654321'],
  ];
  for (const [name, value] of refused) {
    it(`add() refuses ${name} in headers and stores nothing`, async () => {
      const id = `evt_refused_${name.toLowerCase()}`;
      const error = await outbox
        .add(pool, { ...event, id, headers: { [name]: value } })
        .catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(TypeError);
      expect((error as Error).message).not.toContain(value);
      const { rows } = await pool.query(`SELECT 1 FROM "${table}" WHERE id = $1`, [id]);
      expect(rows).toHaveLength(0);
    });
  }

  // Was wrong: a plain object made in another realm (node:vm) was refused as not a plain object.
  it('add() takes headers made in another realm, and stores their entries', async () => {
    const headers = vm.runInNewContext(`({ 'X-Tenant': 'a' })`) as Record<string, string>;
    expect(await outbox.add(pool, { ...event, id: 'evt_realm', headers })).toEqual({ id: 'evt_realm', added: true });
    const { rows } = await pool.query(`SELECT headers FROM "${table}" WHERE id = 'evt_realm'`);
    expect(rows).toEqual([{ headers: { 'X-Tenant': 'a' } }]);
    const map = vm.runInNewContext(`new Map([['x-tenant', 'a']])`) as Record<string, string>;
    await expect(outbox.add(pool, { ...event, id: 'evt_realm_map', headers: map })).rejects.toThrow(TypeError);
  });

  it('the relay still delivers a row an earlier version stored with them, signed and typed as its own', async () => {
    await pool.query(`DELETE FROM "${table}"`);
    const received: { headers: IncomingHttpHeaders; body: string }[] = [];
    const server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on('data', (chunk: Buffer) => chunks.push(chunk));
      request.on('end', () => {
        received.push({ headers: request.headers, body: Buffer.concat(chunks).toString('utf8') });
        response.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
      const stored = {
        'X-Tenant': 'a',
        'Webhook-Id': 'other',
        'webhook-timestamp': '1',
        'Webhook-Signature': 'v1,x',
        'Content-Type': 'text/plain',
        'Content-Length': '3',
      };
      await pool.query(
        `INSERT INTO "${table}" (id, url, body, content_type, headers)
         VALUES ('evt_old', $1, convert_to('{"n":1}', 'UTF8'), 'application/json', $2::jsonb)`,
        [url, JSON.stringify(stored)],
      );
      const sender = createSender({ secret: SECRET, timeout: '5s' });
      expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      expect(received).toHaveLength(1);
      const [delivery] = received;
      expect(delivery?.headers).toMatchObject({
        'x-tenant': 'a',
        'webhook-id': 'evt_old',
        'content-type': 'application/json',
      });
      const verified = createVerifier({ secret: SECRET }).verify({
        headers: delivery?.headers ?? {},
        body: delivery?.body ?? '',
      });
      expect(verified.ok).toBe(true);
      const { rows } = await pool.query(
        `SELECT delivered_at IS NOT NULL AS delivered FROM "${table}" WHERE id = 'evt_old'`,
      );
      expect(rows).toEqual([{ delivered: true }]);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});
