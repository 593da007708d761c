import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createReceiver, createSender, createSigner, type ReceiverEvent } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('transactional receiver');
const root = fileURLToPath(new URL('../../..', import.meta.url));
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');

describe.skipIf(!available)('transactional receiver on PostgreSQL', () => {
  const pool = testPool();
  const records = uniqueTable('records');
  const effects = uniqueTable('effects');
  const children: ChildProcess[] = [];
  const applied = async (id: string) =>
    Number((await pool.query(`SELECT count(*)::int AS n FROM "${effects}" WHERE event_id = $1`, [id])).rows[0].n);
  const expireLeases = () =>
    pool.query(`UPDATE "${records}" SET expires_at = now() - interval '1 second' WHERE state = 'in_progress'`);

  const makeReceiver = () =>
    createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      lease: '60s',
      apply: async (event, tx) => {
        await tx!.query(`INSERT INTO "${effects}" (event_id, pid) VALUES ($1, $2)`, [event.id, process.pid]);
      },
    });
  const deliver = (receiver: ReturnType<typeof makeReceiver>, id: string, payload = body) =>
    receiver.handle({ headers: signer.sign({ id, body: payload, timestamp: new Date() }), body: payload });

  async function startProcess(env: Record<string, string> = {}): Promise<{ url: string; child: ChildProcess }> {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', fileURLToPath(new URL('./fixtures/receiver-process.ts', import.meta.url))],
      {
        cwd: root,
        env: {
          ...process.env,
          DATABASE_URL: databaseUrl,
          RECORDS_TABLE: records,
          EFFECTS_TABLE: effects,
          WEBHOOK_SECRET: SECRET,
          ...env,
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    children.push(child);
    const port = await new Promise<string>((resolve, reject) => {
      let seen = '';
      child.stdout?.on('data', (chunk: Buffer) => {
        seen += chunk.toString();
        const match = /listening (\d+)/.exec(seen);
        if (match) resolve(match[1] as string);
      });
      child.once('exit', (code) => reject(new Error(`receiver process exited early (${code})`)));
    });
    return { url: `http://127.0.0.1:${port}/hooks`, child };
  }
  const exited = (child: ChildProcess) =>
    child.exitCode !== null || child.signalCode !== null
      ? Promise.resolve()
      : new Promise((resolve) => child.once('exit', resolve));

  beforeAll(async () => {
    await migrate(pool, { table: records });
    await pool.query(
      `CREATE TABLE IF NOT EXISTS "${effects}" (n serial PRIMARY KEY, event_id text NOT NULL, pid integer NOT NULL)`,
    );
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${effects}"`);
    await pool.query(`DELETE FROM "${records}"`);
  });
  afterAll(async () => {
    for (const child of children) child.kill('SIGKILL');
    await pool.query(`DROP TABLE IF EXISTS "${records}"`);
    await pool.query(`DROP TABLE IF EXISTS "${effects}"`);
    await pool.end();
  });

  it('records the event and applies its effect in one transaction (cases 1, 2)', async () => {
    const receiver = makeReceiver();
    expect(receiver.settings.transactional).toBe(true);
    expect((await deliver(receiver, 'E1')).outcome).toBe('applied');
    expect((await deliver(receiver, 'E1')).outcome).toBe('duplicate');
    expect(await applied('E1')).toBe(1);
    const { rows } = await pool.query(`SELECT state, fingerprint FROM "${records}"`);
    expect(rows).toEqual([{ state: 'completed', fingerprint: expect.stringMatching(/^[0-9a-f]{64}$/) }]);
  });

  it('rolls the effect back when apply throws, and records nothing (case 6)', async () => {
    let fail = true;
    const receiver = createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      apply: async (event, tx) => {
        await tx!.query(`INSERT INTO "${effects}" (event_id, pid) VALUES ($1, 0)`, [event.id]);
        if (fail) throw new Error('downstream refused');
      },
    });
    expect((await deliver(receiver, 'E1')).status).toBe(500);
    expect(await applied('E1')).toBe(0);
    expect((await pool.query(`SELECT count(*)::int AS n FROM "${records}"`)).rows[0].n).toBe(0);
    fail = false;
    expect((await deliver(receiver, 'E1')).outcome).toBe('applied');
    expect(await applied('E1')).toBe(1);
  });

  it('applies once among concurrent duplicates on separate connections and engines (case 3)', async () => {
    const workers = [makeReceiver(), makeReceiver(), makeReceiver(), makeReceiver()];
    const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => deliver(workers[i % 4]!, 'E1')));
    expect(await applied('E1')).toBe(1);
    const statuses = responses.map((r) => r.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(1);
    expect(statuses.every((s) => s === 200 || s === 409)).toBe(true);
    expect(responses.filter((r) => r.outcome === 'applied')).toHaveLength(1);
  });

  it("fences a worker that held the event past its lease: its late commit fails and only the other's effect stays (case 7)", async () => {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => (entered = resolve));
    const events: ReceiverEvent[] = [];
    const slow = createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      lease: '60s',
      onEvent: (event) => events.push(event),
      apply: async (event, tx) => {
        await tx!.query(`INSERT INTO "${effects}" (event_id, pid) VALUES ($1, 1)`, [event.id]);
        entered();
        await gate;
      },
    });
    const first = deliver(slow, 'E1');
    await inside;
    await expireLeases();
    const second = await deliver(makeReceiver(), 'E1');
    expect(second.outcome).toBe('applied');
    open();
    const late = await first;
    expect(late).toMatchObject({ status: 409, outcome: 'in-progress' });
    // Reported before the delivery's own event: its commit was refused, nothing of it happened.
    expect(events.map((event) => event.type)).toEqual(['record-failed', 'in-progress']);
    expect(events[0]).toMatchObject({ type: 'record-failed', id: 'E1', reason: 'lease-lost' });
    expect(await applied('E1')).toBe(1);
    expect((await pool.query(`SELECT pid FROM "${effects}"`)).rows).toEqual([{ pid: process.pid }]);
    expect((await deliver(makeReceiver(), 'E1')).outcome).toBe('duplicate');
  });

  it('out of order (case 32): the conditional upsert of the docs keeps v2 when v1 comes later, even while v2 is still committing', async () => {
    const payments = uniqueTable('payments');
    await pool.query(`CREATE TABLE "${payments}" (id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`);
    try {
      let hold: { written: () => void; commit: Promise<void> } | undefined;
      const receiver = createReceiver<PostgresTransaction>({
        store: postgresStore({ client: pool, table: records }),
        secret: SECRET,
        apply: async (event, tx) => {
          const { data } = event.json<{ data: { id: string; status: string; version: number } }>();
          await tx!.query(
            `INSERT INTO "${payments}" (id, status, version) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version
             WHERE "${payments}".version < excluded.version`,
            [data.id, data.status, data.version],
          );
          if (data.version === 2 && hold) {
            hold.written();
            await hold.commit;
          }
        },
      });
      const event = (payment: string, status: string, version: number) =>
        Buffer.from(JSON.stringify({ type: `payment.${status}`, data: { id: payment, status, version } }));
      const state = async (payment: string) =>
        (await pool.query(`SELECT status, version::int AS version FROM "${payments}" WHERE id = $1`, [payment])).rows;

      // One after the other: v2 first, then v1. Both acknowledged, v2 kept.
      expect((await deliver(receiver, 'P1-refunded', event('pay_1', 'refunded', 2))).outcome).toBe('applied');
      expect((await deliver(receiver, 'P1-succeeded', event('pay_1', 'succeeded', 1))).outcome).toBe('applied');
      expect(await state('pay_1')).toEqual([{ status: 'refunded', version: 2 }]);

      // At the same time: v2 has written but not committed when v1 arrives. v1's upsert waits on the
      // row, then sees v2 committed and changes nothing.
      let written!: () => void;
      const inside = new Promise<void>((resolve) => (written = resolve));
      let commit!: () => void;
      hold = { written, commit: new Promise<void>((resolve) => (commit = resolve)) };
      const refunded = deliver(receiver, 'P2-refunded', event('pay_2', 'refunded', 2));
      await inside;
      const succeeded = deliver(receiver, 'P2-succeeded', event('pay_2', 'succeeded', 1));
      const waiting = async () =>
        Number(
          (
            await pool.query(
              `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
              [`%INSERT INTO "${payments}"%`],
            )
          ).rows[0].n,
        );
      for (let tries = 0; (await waiting()) === 0; tries++) {
        if (tries > 500) throw new Error('v1 never waited on the row v2 holds');
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      commit();
      expect((await refunded).outcome).toBe('applied');
      expect((await succeeded).outcome).toBe('applied');
      expect(await state('pay_2')).toEqual([{ status: 'refunded', version: 2 }]);
    } finally {
      await pool.query(`DROP TABLE IF EXISTS "${payments}"`);
    }
  });

  it('a crash inside the transaction rolls back the effect; the retry applies once (case 5, real processes)', async () => {
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 1 } });
    const crashing = await startProcess({ CRASH_IN_TX: 'E5' });
    const lost = await sender.send({ url: crashing.url, id: 'E5', body });
    expect(lost.attempts[0]?.result).toBe('network-error');
    await exited(crashing.child);
    expect(await applied('E5')).toBe(0);
    // The dead process's claim stays until its lease ends; end it on the database clock.
    await expireLeases();
    const healthy = await startProcess();
    const retried = await sender.send({ url: healthy.url, id: 'E5', body });
    expect(retried.outcome).toBe('delivered');
    expect(await applied('E5')).toBe(1);
  });

  it('a crash after COMMIT and before the ack: the retry is acknowledged without a second apply (case 4, real processes)', async () => {
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 1 } });
    const crashing = await startProcess({ CRASH_BEFORE_ACK: 'E4' });
    const lost = await sender.send({ url: crashing.url, id: 'E4', body });
    expect(lost.attempts[0]?.result).toBe('network-error');
    await exited(crashing.child);
    expect(await applied('E4')).toBe(1);
    const healthy = await startProcess();
    const retried = await sender.send({ url: healthy.url, id: 'E4', body });
    expect(retried.outcome).toBe('delivered');
    expect(await applied('E4')).toBe(1);
  });
});
