// Case 10: an event whose effect is an HTTP call to another service. The call cannot join the
// receiver's transaction, so `apply` writes its own change and an outbox row in that transaction; a
// relay makes the call afterwards. What must hold: the inbox record, the change and the outbox row
// commit together or not at all, and a relay that dies mid-call and is followed by a resend gets the
// downstream service to apply the effect once, by the webhook-id the outbox sends on every attempt.
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createOutbox, createReceiver, createSender, createSigner, type Receiver } from '../src/index.js';
import { type Endpoint, startEndpoint } from './support/endpoint.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

// The payment provider signs what reaches us; we sign what our relay sends downstream.
const INBOUND_SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const OUTBOUND_SECRET = 'whsec_c2VjcmV0LWZvci10aGUtb3V0Ym94LXJlbGF5';
const available = await postgresAvailable('outbox effect');
const root = fileURLToPath(new URL('../../..', import.meta.url));
const inbound = createSigner({ secret: INBOUND_SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"id":"pay_1","amount":4200}}');

async function until(condition: () => boolean, what: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe.skipIf(!available)('external effect through the outbox (case 10)', () => {
  const pool = testPool();
  const records = uniqueTable('fx_records');
  const effects = uniqueTable('fx_effects');
  const table = uniqueTable('fx_outbox');
  const outbox = createOutbox({ table });
  let downstream: Endpoint | undefined;
  let child: ChildProcess | undefined;
  const count = async (sql: string, values: unknown[] = []) =>
    Number((await pool.query(`SELECT count(*)::int AS n FROM ${sql}`, values)).rows[0].n);

  /** The downstream service: a receiver of its own, which dedupes by webhook-id. */
  function startDownstream() {
    const applied: string[] = [];
    const receiver: Receiver = createReceiver({
      store: memoryStore(),
      secret: OUTBOUND_SECRET,
      apply: (event) => void applied.push(event.id),
    });
    return { receiver, applied };
  }

  /** Our receiver: records the payment and queues the receipt call, in the inbox's transaction. */
  function ourReceiver(url: string, options: { failAfterAdd?: () => boolean } = {}) {
    return createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: INBOUND_SECRET,
      apply: async (event, tx) => {
        await tx!.query(`INSERT INTO "${effects}" (event_id) VALUES ($1)`, [event.id]);
        await outbox.add(tx!, {
          url,
          body: { type: 'receipt.requested', payment: event.json<{ data: { id: string } }>().data.id },
          // For a downstream API that dedupes on Idempotency-Key rather than webhook-id.
          headers: { 'idempotency-key': JSON.stringify(event.id) },
        });
        if (options.failAfterAdd?.()) throw new Error('crashed after outbox.add');
      },
    });
  }
  const deliver = (receiver: Receiver, id: string) =>
    receiver.handle({ headers: inbound.sign({ id, body, timestamp: new Date() }), body });

  beforeAll(async () => {
    await migrate(pool, { table: records });
    await outbox.migrate(pool);
    await pool.query(`CREATE TABLE IF NOT EXISTS "${effects}" (n serial PRIMARY KEY, event_id text NOT NULL)`);
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${effects}"`);
    await pool.query(`DELETE FROM "${records}"`);
    await pool.query(`DELETE FROM "${table}"`);
  });
  afterAll(async () => {
    child?.kill('SIGKILL');
    await downstream?.close();
    await pool.query(`DROP TABLE IF EXISTS "${records}", "${effects}", "${table}"`);
    await pool.end();
  });

  it('an apply that throws after outbox.add leaves no inbox record, no effect and no outbox row; the retry leaves one of each', async () => {
    let fail = true;
    const receiver = ourReceiver('https://receipts.example/hooks', { failAfterAdd: () => fail });
    const failed = await deliver(receiver, 'E1');
    expect(failed).toMatchObject({ status: 500, outcome: 'failed' });
    expect(await count(`"${records}"`)).toBe(0);
    expect(await count(`"${effects}"`)).toBe(0);
    expect(await count(`"${table}"`)).toBe(0);

    fail = false;
    expect((await deliver(receiver, 'E1')).outcome).toBe('applied');
    expect((await deliver(receiver, 'E1')).outcome).toBe('duplicate');
    expect(await count(`"${records}" WHERE state = 'completed'`)).toBe(1);
    expect(await count(`"${effects}" WHERE event_id = 'E1'`)).toBe(1);
    const { rows } = await pool.query(`SELECT status, headers FROM "${table}"`);
    expect(rows).toEqual([{ status: 'pending', headers: { 'idempotency-key': '"E1"' } }]);
  });

  it('a relay process killed mid-call, then a resend: the downstream sees the same webhook-id and Idempotency-Key twice and applies once', async () => {
    const { receiver: theirs, applied } = startDownstream();
    downstream = await startEndpoint(theirs);
    // The downstream applies the call, but its answer never leaves: the relay is waiting on it when it dies.
    downstream.setMode('hold');
    expect((await deliver(ourReceiver(downstream.url), 'E2')).outcome).toBe('applied');
    const [row] = (await pool.query(`SELECT id FROM "${table}"`)).rows as { id: string }[];
    expect(row).toBeDefined();

    child = spawn(
      process.execPath,
      ['--import', 'tsx', fileURLToPath(new URL('./fixtures/relay-process.ts', import.meta.url))],
      {
        cwd: root,
        env: { ...process.env, DATABASE_URL: databaseUrl, OUTBOX_TABLE: table, WEBHOOK_SECRET: OUTBOUND_SECRET },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    await until(() => applied.length === 1, 'the relay process to make the call');
    const exited = new Promise((resolve) => child?.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    expect((await pool.query(`SELECT status, locked_by FROM "${table}"`)).rows).toEqual([
      { status: 'pending', locked_by: 'crashing-relay' },
    ]);

    downstream.setMode('send');
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: OUTBOUND_SECRET, timeout: '5s' }) });
    // End the dead relay's lease and the backoff on the database clock instead of waiting them out.
    await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });

    expect(applied).toEqual([row?.id]);
    expect(downstream.requests.get(row?.id as string)).toBe(2);
    expect(downstream.headers.map((headers) => [headers['webhook-id'], headers['idempotency-key']])).toEqual([
      [row?.id, '"E2"'],
      [row?.id, '"E2"'],
    ]);
    // Each attempt was signed afresh; only the id stayed.
    expect(downstream.headers[0]?.['webhook-signature']).toBeDefined();
    // Our side applied the inbound event once, too.
    expect(await count(`"${effects}" WHERE event_id = 'E2'`)).toBe(1);
  });
});
