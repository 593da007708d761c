// The receiver while its database fails inside `apply`: the same outage as the inbox's store failing
// before or at commit, so the same answer, DESIGN.md's 503 with Retry-After (the sender retries soon),
// never the 500 of a bug, and the event id is left free: the retry applies the event, once.
//
// The fault is the database's own, on PGlite and PostgreSQL: a trigger on the charges' table refuses
// this test's charge with the error of a connection the server terminated (57P01), in the middle of
// `apply` (after the event's row, before its charge's state). The receiver needs no mapping of its own
// for it: every statement of its `apply` goes through the inbox's `tx`, whose failures the PostgreSQL
// store already turns into a `StoreUnavailableError` (toStoreError), which @idem/webhooks answers 503.
// An `apply` that wrote through the app's own pool instead would fail this test with a 500.
import { randomUUID } from 'node:crypto';
import { sign } from '@idem/webhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { findChargeState } from '../src/receiver/charges.js';
import { findReceivedEvent } from '../src/receiver/events.js';
import { type RunningReceiver, startReceiver } from '../src/receiver/index.js';
import { databases } from './db-faults.js';
import { openTestDatabase } from './services.js';

const secret = `whsec_${Buffer.alloc(32, 3).toString('base64')}`;

describe.each(databases)('the receiver while its database fails inside apply, on %s', (_name, embedded) => {
  let db: Database;
  let receiver: RunningReceiver;

  beforeAll(async () => {
    db = await openTestDatabase('receiver_store', { embedded });
    receiver = await startReceiver({ port: 0, db, webhookSecret: secret, onRejectedDeliveries: () => undefined });
  }, 60_000);

  afterAll(async () => {
    await receiver?.close();
    await db?.close();
  });

  const post = (id: string, body: string) =>
    fetch(receiver.webhookUrl, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret }),
      },
      body,
    });

  it('answers 503 store_unavailable with Retry-After, applies nothing, and the retry applies the event once', {
    timeout: 30_000,
  }, async () => {
    const chargeId = `ch_${randomUUID()}`;
    const id = `evt_down_${randomUUID().replaceAll('-', '')}`;
    const body = JSON.stringify({
      type: 'payment.succeeded',
      data: { id: chargeId, status: 'succeeded', amount: 100, currency: 'EUR' },
    });
    // The message and code of a connection the server ended (db-faults.ts's `terminated`), raised by the
    // database on this charge's row only.
    await db.query(`
      create or replace function audit_receiver_down() returns trigger language plpgsql as $$
      begin
        raise exception 'terminating connection due to administrator command' using errcode = '57P01';
      end $$`);
    await db.query(
      `create trigger audit_receiver_down before insert on receiver_charges
         for each row when (new.charge_id = '${chargeId}') execute function audit_receiver_down()`,
    );
    let dropped = false;
    const drop = async () => {
      if (dropped) return;
      dropped = true;
      await db.query('drop trigger audit_receiver_down on receiver_charges');
      await db.query('drop function audit_receiver_down()');
    };
    try {
      const down = await post(id, body);
      expect(down.status).toBe(503);
      expect(down.headers.get('retry-after')).toBe('2');
      expect(await down.json()).toMatchObject({ code: 'store_unavailable', retryable: true });
      // Rolled back with the record of the id: the event's row holds only its delivery count.
      expect((await findReceivedEvent(db, id))?.applied ?? 0).toBe(0);
      expect(await findChargeState(db, chargeId)).toBeUndefined();

      await drop();
      const retried = await post(id, body);
      await retried.arrayBuffer();
      expect(retried.status).toBe(200);
      const again = await post(id, body);
      await again.arrayBuffer();
      expect(again.status).toBe(200);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(await findReceivedEvent(db, id)).toMatchObject({ applied: 1, deliveries: 3 });
      expect(await findChargeState(db, chargeId)).toMatchObject({ status: 'succeeded', eventId: id });
    } finally {
      await drop();
    }
  });
});
