import { type ChildProcess, spawn } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createOutbox,
  createReceiver,
  createSender,
  type Outbox,
  type OutboxEvent,
  type Receiver,
  type Sender,
} from '../src/index.js';
import { type Endpoint, startEndpoint } from './support/endpoint.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox');
const root = fileURLToPath(new URL('../../..', import.meta.url));

type Handler = (request: IncomingMessage, response: ServerResponse) => void;
async function scripted(handler: Handler) {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function makeReceiver() {
  const applied: string[] = [];
  const receiver: Receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.id),
  });
  return { receiver, applied };
}

async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe.skipIf(!available)('PostgreSQL transactional outbox', () => {
  const pool = testPool();
  const table = uniqueTable('outbox');
  const outbox: Outbox = createOutbox({ table });
  const sender = createSender({ secret: SECRET, timeout: '5s' });
  const rows = async (where = 'true') => (await pool.query(`SELECT * FROM "${table}" WHERE ${where} ORDER BY id`)).rows;
  const clear = () => pool.query(`DELETE FROM "${table}"`);

  beforeAll(async () => {
    await Promise.all([outbox.migrate(pool), outbox.migrate(pool), outbox.migrate(pool)]);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it('sends an event only if the business transaction commits', async () => {
    await clear();
    const { receiver, applied } = makeReceiver();
    const endpoint = await startEndpoint(receiver);
    try {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await outbox.add(client, { id: 'rolled_back', url: endpoint.url, body: { type: 'order.paid' } });
        await client.query('ROLLBACK');
        await client.query('BEGIN');
        const added = await outbox.add(client, { id: 'committed', url: endpoint.url, body: { type: 'order.paid' } });
        expect(added).toEqual({ id: 'committed', added: true });
        expect(await outbox.add(client, { id: 'committed', url: endpoint.url, body: 'other' })).toEqual({
          id: 'committed',
          added: false,
        });
        await client.query('COMMIT');
      } finally {
        client.release();
      }
      const relay = outbox.relay({ db: pool, sender });
      expect(await relay.runOnce()).toEqual({ claimed: 1, delivered: 1, retrying: 0, dead: 0 });
      expect(applied).toEqual(['committed']);
      const [row] = await rows();
      expect(row).toMatchObject({ id: 'committed', status: 'delivered', attempts: 1, locked_by: null });
      expect(row.history).toHaveLength(1);
      expect(await relay.runOnce()).toMatchObject({ claimed: 0 });
    } finally {
      await endpoint.close();
    }
  });

  it('retries on the database clock, dead-letters on 410 with its history, and requeues by hand', async () => {
    await clear();
    let status = 500;
    const server = await scripted((_request, response) => {
      response.statusCode = status;
      response.end(status === 410 ? 'gone for good' : 'try later');
    });
    try {
      await outbox.add(pool, { id: 'E1', url: server.url, body: '{"n":1}' });
      const relay = outbox.relay({ db: pool, sender });
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      let [row] = await rows();
      expect(row).toMatchObject({ status: 'pending', attempts: 1, locked_until: null });
      expect(row.last_attempt).toMatchObject({ status: 500, result: 'failed', responseBody: 'try later' });
      // Not due yet: the backoff wait is timed by PostgreSQL.
      const due = await pool.query(`SELECT next_attempt_at > now() AS later FROM "${table}"`);
      expect(due.rows[0].later || row.last_attempt.waitMs === 0).toBe(true);
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      status = 410;
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      [row] = await rows();
      expect(row).toMatchObject({ status: 'dead', dead_reason: 'gone', attempts: 2 });
      const dead = await outbox.deadLetters(pool);
      expect(dead.map((d) => [d.id, d.deadReason, d.history.length])).toEqual([['E1', 'gone', 2]]);
      expect(dead[0]?.lastAttempt).toMatchObject({ status: 410, responseBody: 'gone for good' });

      status = 200;
      expect(await outbox.requeue(pool, 'E1')).toBe(true);
      expect(await outbox.requeue(pool, 'E1')).toBe(false);
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
    } finally {
      await server.close();
    }
  });

  it('treats 410 as the endpoint being gone: every waiting event for that URL is dead-lettered', async () => {
    await clear();
    const gone = await scripted((_request, response) => {
      response.statusCode = 410;
      response.end();
    });
    const { receiver, applied } = makeReceiver();
    const alive = await startEndpoint(receiver);
    try {
      for (const id of ['G1', 'G2', 'G3']) await outbox.add(pool, { id, url: gone.url, body: '{}' });
      await outbox.add(pool, { id: 'A1', url: alive.url, body: '{}' });
      const round = await outbox.relay({ db: pool, sender, batchSize: 1 }).runOnce();
      expect(round).toMatchObject({ claimed: 1 });
      const states = Object.fromEntries((await rows()).map((row) => [row.id, row.status]));
      if (states.A1 === 'delivered') {
        // The single claimed row went to the live endpoint; the next round finds the gone one.
        await outbox.relay({ db: pool, sender, batchSize: 1 }).runOnce();
      }
      const after = await rows();
      expect(after.filter((row) => row.url === gone.url).map((row) => [row.status, row.dead_reason])).toEqual([
        ['dead', 'gone'],
        ['dead', 'gone'],
        ['dead', 'gone'],
      ]);
      expect(after.filter((row) => row.url === gone.url).reduce((sum, row) => sum + row.attempts, 0)).toBe(1);
      await outbox.relay({ db: pool, sender }).runOnce();
      expect(applied).toEqual(['A1']);
    } finally {
      await gone.close();
      await alive.close();
    }
  });

  it('dead-letters past the horizon and after maxAttempts', async () => {
    await clear();
    const server = await scripted((_request, response) => {
      response.statusCode = 503;
      response.end();
    });
    try {
      const short = createSender({ secret: SECRET, schedule: { horizon: '30m' } });
      await outbox.add(pool, { id: 'old', url: server.url, body: '{}' });
      await pool.query(`UPDATE "${table}" SET created_at = now() - interval '1 hour'`);
      expect(await outbox.relay({ db: pool, sender: short }).runOnce()).toMatchObject({ dead: 1 });
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'horizon' });

      await clear();
      const twice = createSender({ secret: SECRET, schedule: { maxAttempts: 2 } });
      await outbox.add(pool, { id: 'twice', url: server.url, body: '{}' });
      const relay = outbox.relay({ db: pool, sender: twice });
      expect(await relay.runOnce()).toMatchObject({ retrying: 1 });
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      expect(await relay.runOnce()).toMatchObject({ dead: 1 });
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'max-attempts', attempts: 2 });
    } finally {
      await server.close();
    }
  });

  it('shares the work between several relays without ever sending an event twice', async () => {
    await clear();
    const { receiver, applied } = makeReceiver();
    const endpoint = await startEndpoint(receiver);
    const pools = Array.from({ length: 4 }, () => testPool({ max: 3 }));
    try {
      const client = await pool.connect();
      await client.query('BEGIN');
      for (let i = 0; i < 200; i++) await outbox.add(client, { id: `evt_${i}`, url: endpoint.url, body: { i } });
      await client.query('COMMIT');
      client.release();
      const relays = pools.map((db, i) => outbox.relay({ db, sender, batchSize: 7, relayId: `relay-${i}` }));
      const claimedBy = new Map<string, number>();
      await Promise.all(
        relays.map(async (relay) => {
          for (;;) {
            const round = await relay.runOnce();
            claimedBy.set(relay.relayId, (claimedBy.get(relay.relayId) ?? 0) + round.claimed);
            if (round.claimed === 0) return;
          }
        }),
      );
      expect(applied).toHaveLength(200);
      expect([...endpoint.requests.values()].every((count) => count === 1)).toBe(true);
      expect(endpoint.requests.size).toBe(200);
      expect((await rows("status <> 'delivered'")).length).toBe(0);
      // Every relay took part: the work was shared, not serialised behind one lock.
      expect([...claimedBy.values()].filter((n) => n > 0).length).toBeGreaterThan(1);
    } finally {
      await endpoint.close();
      await Promise.all(pools.map((p) => p.end()));
    }
  });

  it('fences a relay whose lease ran out: its late result cannot overwrite the delivery of the relay that took over', async () => {
    await clear();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let calls = 0;
    const server = await scripted(async (_request, response) => {
      calls++;
      if (calls === 1) {
        await held;
        response.statusCode = 500;
      } else response.statusCode = 200;
      response.end();
    });
    try {
      await outbox.add(pool, { id: 'E1', url: server.url, body: '{}' });
      const a = outbox.relay({ db: pool, sender, relayId: 'relay-a' });
      const b = outbox.relay({ db: pool, sender, relayId: 'relay-b' });
      const first = a.runOnce();
      await until(() => calls === 1, 'relay A to call the endpoint');
      // Relay A stalls past its lease (the database clock says so):
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      expect(await b.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      release();
      expect(await first).toMatchObject({ claimed: 1, delivered: 0 });
      expect((await rows())[0]).toMatchObject({ status: 'delivered', attempts: 2 });
    } finally {
      await server.close();
    }
  });

  it('fences by claim, not by relay id alone: a stalled relay cannot overwrite a delivery made under the same relayId', async () => {
    await clear();
    const held: (() => void)[] = [];
    let calls = 0;
    const server = await scripted(async (_request, response) => {
      const call = ++calls;
      await new Promise<void>((resolve) => held.push(resolve));
      response.statusCode = call === 1 ? 500 : 200;
      response.end();
    });
    try {
      await outbox.add(pool, { id: 'E1', url: server.url, body: '{}' });
      // Two replicas configured with one relayId (a host name, say).
      const a = outbox.relay({ db: pool, sender, relayId: 'worker' });
      const b = outbox.relay({ db: pool, sender, relayId: 'worker' });
      const first = a.runOnce();
      await until(() => held.length === 1, 'the first attempt to reach the endpoint');
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      const second = b.runOnce();
      await until(() => held.length === 2, 'the second attempt to reach the endpoint');
      held[0]?.();
      await first;
      held[1]?.();
      expect(await second).toMatchObject({ claimed: 1, delivered: 1 });
      expect((await rows())[0]).toMatchObject({ status: 'delivered', attempts: 2 });
    } finally {
      await server.close();
    }
  });

  it('never attempts a row taken over from a dead relay past maxAttempts or the horizon', async () => {
    await clear();
    let release!: () => void;
    const hold = new Promise<void>((resolve) => (release = resolve));
    let calls = 0;
    const server = await scripted(async (_request, response) => {
      calls++;
      await hold;
      response.statusCode = 500;
      response.end();
    });
    try {
      const once = createSender({ secret: SECRET, timeout: '5s', schedule: { maxAttempts: 1 } });
      await outbox.add(pool, { id: 'last', url: server.url, body: '{}' });
      // A relay makes the only attempt allowed, then stalls (or dies) and its lease runs out.
      const stalled = outbox.relay({ db: pool, sender: once }).runOnce();
      await until(() => calls === 1, 'the only attempt to reach the endpoint');
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      expect(await outbox.relay({ db: pool, sender: once }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      expect(calls).toBe(1);
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'max-attempts', attempts: 1 });
      release();
      await stalled;
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'max-attempts', attempts: 1 });

      // A retry whose relay died, taken over after the horizon: receivers were promised no later attempt.
      await clear();
      const short = createSender({ secret: SECRET, timeout: '5s', schedule: { horizon: '1h' } });
      await outbox.add(pool, { id: 'late', url: server.url, body: '{}' });
      await pool.query(
        `UPDATE "${table}" SET attempts = 2, locked_by = 'died', locked_until = now() - interval '1 second',
                created_at = now() - interval '2 hours'`,
      );
      expect(await outbox.relay({ db: pool, sender: short }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      expect(calls).toBe(1);
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'horizon', attempts: 2 });
    } finally {
      release();
      await server.close();
    }
  });

  it('records an answer whose body holds a NUL byte instead of sending the event again and again', async () => {
    // jsonb refuses \u0000: unhandled, the record fails, the row stays leased and is redelivered forever.
    await clear();
    let calls = 0;
    const server = await scripted((_request, response) => {
      calls++;
      response.statusCode = 200;
      response.end(Buffer.from('ok\0', 'utf8'));
    });
    try {
      await outbox.add(pool, { id: 'E1', url: server.url, body: '{}' });
      expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      const [row] = await rows();
      expect(row).toMatchObject({ status: 'delivered', locked_by: null });
      expect(row.last_attempt.responseBody).toBe('ok\ufffd');
      expect(calls).toBe(1);
    } finally {
      await server.close();
    }
  });

  it('ends a round only when every row is recorded, even when one attempt throws', async () => {
    await clear();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let started = 0;
    let bothStarted!: () => void;
    const attemptsStarted = new Promise<void>((resolve) => (bothStarted = resolve));
    const throwing: Sender = {
      ...sender,
      attempt: async (message, number) => {
        if (++started === 2) bothStarted();
        if (message.id === 'throws') throw new Error('sender bug');
        await gate;
        return { attempt: number, startedAt: 0, timestamp: 0, durationMs: 0, result: 'delivered', status: 200 };
      },
    };
    await outbox.add(pool, { id: 'throws', url: 'https://receiver.test/hooks', body: '{}' });
    await outbox.add(pool, { id: 'waits', url: 'https://receiver.test/hooks', body: '{}' });
    let settled = false;
    const round = outbox.relay({ db: pool, sender: throwing }).runOnce();
    const outcome = round.then(
      () => 'resolved',
      (error: Error) => error.message,
    );
    void outcome.finally(() => {
      settled = true;
    });
    await attemptsStarted;
    // One turn of the event loop lets the failed attempt reach the round; the other row is still out.
    await new Promise((resolve) => setImmediate(resolve));
    expect(settled).toBe(false);
    release();
    expect(await outcome).toBe('sender bug');
    expect((await rows()).map((row) => [row.id, row.status])).toEqual([
      ['throws', 'pending'],
      ['waits', 'delivered'],
    ]);
  });

  it('refuses at add what could never be delivered', async () => {
    await clear();
    const url = 'https://receiver.test/hooks';
    const events: OutboxEvent[] = [
      { url: 'mailto:ops@example.com', body: '{}' },
      { url: 'file:///etc/passwd', body: '{}' },
      { url, body: '{}', headers: { 'bad name': 'x' } },
      { url, body: '{}', headers: { 'x-note': 'one\r\ntwo' } },
      { url, body: '{}', headers: { 'x-count': 1 as unknown as string } },
      { url, body: '{}', contentType: 'text/plain\r\nx-evil: 1' },
      { url, body: undefined as unknown as string },
    ];
    for (const event of events) {
      await expect(outbox.add(pool, event)).rejects.toThrow(TypeError);
    }
    expect(await rows()).toEqual([]);
  });

  describe('crash of a relay process (case 10)', () => {
    let child: ChildProcess | undefined;
    let endpoint: Endpoint | undefined;
    afterAll(async () => {
      child?.kill('SIGKILL');
      await endpoint?.close();
    });

    it('resumes after the lease: the receiver sees each id twice and applies it once', async () => {
      await clear();
      const { receiver, applied } = makeReceiver();
      endpoint = await startEndpoint(receiver);
      // The receiver applies every event but the acknowledgements never leave: the relay is stuck
      // mid-delivery when it dies.
      endpoint.setMode('hold');
      for (let i = 0; i < 5; i++) await outbox.add(pool, { id: `crash_${i}`, url: endpoint.url, body: { i } });
      child = spawn(
        process.execPath,
        ['--import', 'tsx', fileURLToPath(new URL('./fixtures/relay-process.ts', import.meta.url))],
        {
          cwd: root,
          env: { ...process.env, DATABASE_URL: databaseUrl, OUTBOX_TABLE: table, WEBHOOK_SECRET: SECRET },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      await until(() => applied.length === 5, 'the relay process to deliver all five');
      child.kill('SIGKILL');
      await new Promise((resolve) => child?.once('exit', resolve));
      const leased = await rows();
      expect(leased.every((row) => row.status === 'pending' && row.locked_by === 'crashing-relay')).toBe(true);

      endpoint.setMode('send');
      const survivor = outbox.relay({ db: pool, sender });
      // Still leased: nothing is taken over early.
      expect(await survivor.runOnce()).toMatchObject({ claimed: 0 });
      // The lease ends (moved by SQL, on the database clock, instead of waiting 60 s).
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      expect(await survivor.runOnce()).toMatchObject({ claimed: 5, delivered: 5 });
      expect(applied).toHaveLength(5);
      expect([...endpoint.requests.values()]).toEqual([2, 2, 2, 2, 2]);
      expect((await rows("status = 'delivered'")).length).toBe(5);
    });
  });

  it('runs as a background loop and stops cleanly', async () => {
    await clear();
    const { receiver, applied } = makeReceiver();
    const endpoint = await startEndpoint(receiver);
    try {
      const relay = outbox.relay({ db: pool, sender, pollInterval: '10ms' });
      relay.start();
      await outbox.add(pool, { id: 'loop_1', url: endpoint.url, body: '{}' });
      await until(() => applied.length === 1, 'the loop to deliver');
      await relay.stop();
      expect(applied).toEqual(['loop_1']);
    } finally {
      await endpoint.close();
    }
  });

  it('the background loop reports a failing round through onError and goes on', async () => {
    const errors: unknown[] = [];
    let failing = true;
    // A database that is down for the first rounds, then comes back.
    const db = {
      query: (text: string, params?: unknown[]) =>
        failing ? Promise.reject(new Error('connect ECONNREFUSED')) : pool.query(text, params),
    };
    const relay = outbox.relay({
      db,
      sender,
      pollInterval: '10ms',
      onError: (error) => {
        errors.push(error);
        if (errors.length === 2) failing = false;
        throw new Error('an observer that throws changes nothing');
      },
    });
    relay.start();
    await until(() => errors.length >= 2, 'two failed rounds to be reported');
    await relay.stop();
    expect(String(errors[0])).toMatch(/ECONNREFUSED/);
    expect(errors).toHaveLength(2);
  });

  it('requeue gives a row that died at maxAttempts a fresh set of attempts', async () => {
    await clear();
    let status = 500;
    const server = await scripted((_request, response) => {
      response.statusCode = status;
      response.end();
    });
    try {
      const once = createSender({ secret: SECRET, timeout: '5s', schedule: { maxAttempts: 1 } });
      const relay = outbox.relay({ db: pool, sender: once });
      await outbox.add(pool, { id: 'M1', url: server.url, body: '{}' });
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      status = 200;
      expect(await outbox.requeue(pool, 'M1')).toBe(true);
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      const [row] = await rows("id = 'M1'");
      expect(row).toMatchObject({ status: 'delivered', attempts: 1 });
      expect(row.history).toHaveLength(2);
    } finally {
      await server.close();
    }
  });

  it('migrate() of one table named two ways at once: both succeed; a long name still gets its own index', async () => {
    const short = uniqueTable('twoways');
    const long = `${uniqueTable('long')}_${'x'.repeat(63)}`.slice(0, 63);
    try {
      await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          createOutbox({ table: i % 2 === 0 ? short : `public.${short}` }).migrate(pool),
        ),
      );
      await createOutbox({ table: long }).migrate(pool);
      const { rows: indexes } = await pool.query(
        `SELECT indexrelid::regclass::text AS name FROM pg_index WHERE indrelid = $1::regclass AND NOT indisprimary`,
        [`"${long}"`],
      );
      expect(indexes).toHaveLength(1);
      expect(indexes[0].name).toMatch(/_due"?$/);
    } finally {
      await pool.query(`DROP TABLE IF EXISTS "${short}", "${long}"`);
    }
  });

  it('refuses bad table names and options', () => {
    expect(() => createOutbox({ table: 'x; DROP TABLE y' })).toThrow(TypeError);
    expect(() => createOutbox({ table: 'a.b.c' })).toThrow(TypeError);
    expect(() => outbox.relay({ db: pool, sender, lease: '1s' })).toThrow(/timeout/);
    expect(() => outbox.relay({ db: pool, sender, batchSize: 0 })).toThrow(TypeError);
    // Its timer would fire at once: a relay polling in a tight loop.
    expect(() => outbox.relay({ db: pool, sender, pollInterval: '30d' })).toThrow(/pollInterval/);
  });
});
