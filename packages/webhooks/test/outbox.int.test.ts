import { type ChildProcess, spawn } from 'node:child_process';
import { getEventListeners } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { captureWarnings } from '../../core/test/support/warnings.js';
import {
  createOutbox,
  createReceiver,
  createSender,
  type LostAttempt,
  type Outbox,
  type OutboxEvent,
  type Receiver,
  type ScheduleOptions,
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
        expect(await outbox.add(client, { id: 'committed', url: endpoint.url, body: { type: 'order.paid' } })).toEqual({
          id: 'committed',
          added: false,
        });
        await client.query('COMMIT');
      } finally {
        client.release();
      }
      const relay = outbox.relay({ db: pool, sender });
      expect(await relay.runOnce()).toEqual({ claimed: 1, delivered: 1, retrying: 0, dead: 0, fenced: 0 });
      expect(applied).toEqual(['committed']);
      const [row] = await rows();
      expect(row).toMatchObject({ id: 'committed', status: 'delivered', attempts: 1, locked_by: null });
      expect(row.history).toHaveLength(1);
      expect(await relay.runOnce()).toMatchObject({ claimed: 0 });
    } finally {
      await endpoint.close();
    }
  });

  it('keeps the first 10 and the latest 90 attempts in a history past 100, and counts them all', async () => {
    await clear();
    const server = await scripted((_request, response) => {
      response.statusCode = 500;
      response.end('x'.repeat(2000));
    });
    try {
      await outbox.add(pool, { id: 'stuck', url: server.url, body: '{"n":1}' });
      // No wait between attempts (a jitter of 0), so each round finds the row due again.
      const eager = createSender({ secret: SECRET, timeout: '5s', random: () => 0 });
      const relay = outbox.relay({ db: pool, sender: eager });
      for (let round = 1; round <= 105; round++) {
        expect(await relay.runOnce(), `round ${round}`).toMatchObject({ claimed: 1, retrying: 1 });
      }
      const [row] = await rows();
      expect(row.attempts).toBe(105);
      const numbers = row.history.map((entry: { attempt: number }) => entry.attempt);
      expect(numbers).toEqual([
        ...Array.from({ length: 10 }, (_, i) => i + 1),
        ...Array.from({ length: 90 }, (_, i) => i + 16),
      ]);
      expect(row.last_attempt).toEqual(row.history[99]);
      // The response kept in each entry is cut to its KiB.
      expect(row.history[99].responseBody.length).toBeLessThanOrEqual(1024);
    } finally {
      await server.close();
    }
  });

  it('caps the history with the entry of a lost claim too, as with an attempt that came back', async () => {
    await clear();
    await outbox.add(pool, { id: 'lost-at-cap', url: 'https://receiver.test/hooks', body: '{}' });
    // A row with a full history whose relay died mid-attempt: its lease ran out, so the next claim
    // takes it over and writes the lost attempt's entry (withLost), past the cap.
    await pool.query(
      `UPDATE "${table}"
          SET attempts = 100, claims = 100, locked_by = 'gone', locked_until = now() - interval '1 second',
              history = (SELECT jsonb_agg(jsonb_build_object('attempt', n, 'result', 'failed') ORDER BY n)
                           FROM generate_series(1, 100) AS n)`,
    );
    await outbox.relay({ db: pool, sender, relayId: 'takes-over' }).runOnce();
    const [row] = await rows();
    expect(row.history).toHaveLength(100);
    expect(row.history.slice(0, 11).map((entry: { attempt: number }) => entry.attempt)).toEqual([
      1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12,
    ]);
    expect(row.history[99]).toMatchObject({ attempt: 100, result: 'lost', relayId: 'gone' });
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
      // Jitter at the top of the first ceiling (about 1 s): with a random wait, one of a few
      // milliseconds had passed before the check below on a slow box, and it saw the row due.
      const patient = createSender({ secret: SECRET, timeout: '5s', random: () => 0.999 });
      const relay = outbox.relay({ db: pool, sender: patient });
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      let [row] = await rows();
      expect(row).toMatchObject({ status: 'pending', attempts: 1, locked_until: null });
      expect(row.last_attempt).toMatchObject({ status: 500, result: 'failed', responseBody: 'try later' });
      expect(row.last_attempt.waitMs).toBeGreaterThan(900);
      // Not due yet: the backoff wait is timed by PostgreSQL.
      const due = await pool.query(`SELECT next_attempt_at > now() AS later FROM "${table}"`);
      expect(due.rows[0].later).toBe(true);
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      status = 410;
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      [row] = await rows();
      expect(row).toMatchObject({ status: 'dead', dead_reason: 'gone', attempts: 2 });
      const dead = await outbox.deadLetters(pool);
      expect(dead.rows.map((d) => [d.id, d.deadReason, d.history.length])).toEqual([['E1', 'gone', 2]]);
      expect(dead.rows[0]?.lastAttempt).toMatchObject({ status: 410, responseBody: 'gone for good' });
      expect(dead.next).toBeUndefined();

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

  it('a 410 leaves a row of the same URL that another relay holds under a live lease to that relay', async () => {
    await clear();
    const gone = await scripted((_request, response) => {
      response.statusCode = 410;
      response.end();
    });
    try {
      await outbox.add(pool, { id: 'G1', url: gone.url, body: '{}' });
      await outbox.add(pool, { id: 'G2', url: gone.url, body: '{}' });
      // G2 is in flight at another relay, its lease still running.
      await pool.query(
        `UPDATE "${table}" SET locked_by = 'busy', locked_until = now() + interval '1 minute', claims = 1, attempts = 1
          WHERE id = 'G2'`,
      );
      expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      const [first, held] = await rows();
      expect(first).toMatchObject({ id: 'G1', status: 'dead', dead_reason: 'gone' });
      expect(held).toMatchObject({ id: 'G2', status: 'pending', dead_reason: null, locked_by: 'busy' });
    } finally {
      await gone.close();
    }
  });

  it('waits out a Retry-After the endpoint asks for before the next attempt, on the database clock', async () => {
    await clear();
    const server = await scripted((_request, response) => {
      response.statusCode = 503;
      response.setHeader('retry-after', '600');
      response.end();
    });
    try {
      const patient = createSender({ secret: SECRET, timeout: '5s', random: () => 0 });
      await outbox.add(pool, { id: 'R1', url: server.url, body: '{}' });
      const told: unknown[] = [];
      const relay = outbox.relay({ db: pool, sender: patient, onAttempt: (_row, attempt) => void told.push(attempt) });
      expect(await relay.runOnce()).toMatchObject({ retrying: 1 });
      // onAttempt is told the wait too, as it is recorded.
      expect(told).toEqual([expect.objectContaining({ status: 503, waitMs: 600_000 })]);
      const { rows: due } = await pool.query(
        `SELECT extract(epoch FROM next_attempt_at - now()) AS seconds, last_attempt FROM "${table}"`,
      );
      expect(Number(due[0].seconds)).toBeGreaterThan(590);
      expect(due[0].last_attempt).toMatchObject({ status: 503, retryAfterMs: 600_000, waitMs: 600_000 });
    } finally {
      await server.close();
    }
  });

  it("leases a claimed row for the sender's timeout plus 15 s by default", async () => {
    await clear();
    let started = 0;
    const hanging: Sender = {
      ...sender,
      attempt: () => {
        started++;
        return new Promise<never>(() => undefined);
      },
    };
    await outbox.add(pool, { id: 'L1', url: 'https://receiver.test/hooks', body: '{}' });
    void outbox.relay({ db: pool, sender: hanging, relayId: 'holder' }).runOnce();
    await until(() => started === 1, 'the relay to start its attempt');
    const { rows: held } = await pool.query(
      `SELECT locked_by, extract(epoch FROM locked_until - now()) AS seconds FROM "${table}"`,
    );
    // The sender's timeout is 5 s: a lease of 20 s, less the moment since the claim.
    expect(held[0].locked_by).toBe('holder');
    expect(Number(held[0].seconds)).toBeGreaterThan(15);
    expect(Number(held[0].seconds)).toBeLessThanOrEqual(20);
  });

  it('a 410 that dead-letters a row taken from a dead relay records its lost attempt', async () => {
    await clear();
    const gone = await scripted((_request, response) => {
      response.statusCode = 410;
      response.end();
    });
    try {
      // A relay claims G2 and dies mid-attempt: its attempt never returns. Its lease runs out.
      let started = 0;
      const dying: Sender = {
        ...sender,
        attempt: () => {
          started++;
          return new Promise<never>(() => undefined);
        },
      };
      await outbox.add(pool, { id: 'G2', url: gone.url, body: '{}' });
      void outbox.relay({ db: pool, sender: dying, relayId: 'dies' }).runOnce();
      await until(() => started === 1, 'the dying relay to start its attempt');
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      // G1, due first, is the one claimed (batchSize 1); its 410 sweeps G2 before any claim takes it over.
      await outbox.add(pool, { id: 'G1', url: gone.url, body: '{}' });
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now() - interval '1 minute' WHERE id = 'G1'`);
      expect(await outbox.relay({ db: pool, sender, batchSize: 1 }).runOnce()).toMatchObject({ claimed: 1, dead: 2 });
      const [, swept] = await rows();
      expect(swept).toMatchObject({ id: 'G2', status: 'dead', dead_reason: 'gone', attempts: 1, locked_by: null });
      expect(swept.history).toMatchObject([{ attempt: 1, result: 'lost', claim: 1, relayId: 'dies' }]);
      expect(swept.last_attempt).toBeNull();
    } finally {
      await gone.close();
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

  it('still makes the first attempt of an event added longer ago than the horizon, then dead-letters it', async () => {
    await clear();
    let hits = 0;
    const server = await scripted((_request, response) => {
      hits++;
      response.statusCode = 503;
      response.end();
    });
    try {
      // The relays were down for an hour: the event was never attempted, so it gets its one attempt.
      const short = createSender({ secret: SECRET, schedule: { horizon: '30m' } });
      await outbox.add(pool, { id: 'never-tried', url: server.url, body: '{}' });
      await pool.query(`UPDATE "${table}" SET created_at = now() - interval '1 hour'`);
      expect(await outbox.relay({ db: pool, sender: short }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      expect(hits).toBe(1);
      expect((await rows())[0]).toMatchObject({ status: 'dead', dead_reason: 'horizon', attempts: 1 });
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
      // Each pool connected before any relay starts: on a loaded box a relay still opening its first
      // connection found the work done by the first one (the share is what is checked below).
      await Promise.all(pools.map((db) => db.query('select 1')));
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
      // Relay A stalls past its lease (the database clock says so). B takes the row over: A's attempt
      // counts as failed, and the row waits out its backoff (made due at once here) before B sends it.
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      expect(await b.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      expect(await b.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      release();
      // A's late 500 is refused, and counted as fenced: it is not a retry of anything. Its attempt
      // stays in the history as B found it, lost.
      expect(await first).toEqual({ claimed: 1, delivered: 0, retrying: 0, dead: 0, fenced: 1 });
      const [row] = await rows();
      expect(row).toMatchObject({ status: 'delivered', attempts: 2 });
      expect(row.history).toMatchObject([
        { attempt: 1, result: 'lost', relayId: 'relay-a' },
        { attempt: 2, result: 'delivered', status: 200 },
      ]);
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
      expect(await b.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      const second = b.runOnce();
      await until(() => held.length === 2, 'the second attempt to reach the endpoint');
      held[0]?.();
      expect(await first).toMatchObject({ claimed: 1, fenced: 1 });
      held[1]?.();
      expect(await second).toMatchObject({ claimed: 1, delivered: 1 });
      expect((await rows())[0]).toMatchObject({ status: 'delivered', attempts: 2 });
    } finally {
      await server.close();
    }
  });

  // Found untested by a mutation pass (the fence without `attempts = $4` changed no test). A relay of
  // an earlier version raises `attempts` when it claims, never `claims`: during a rolling upgrade, one
  // that shares this relay's relayId and takes the row over leaves `claims` as this claim saw it, and
  // only the attempt count tells the two claims apart.
  it('fences a stalled claim out of a takeover by an earlier version under the same relayId (attempts only)', async () => {
    await clear();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let calls = 0;
    const server = await scripted(async (_request, response) => {
      calls++;
      await held;
      response.statusCode = 500;
      response.end();
    });
    try {
      await outbox.add(pool, { id: 'E1', url: server.url, body: '{}' });
      const relay = outbox.relay({ db: pool, sender, relayId: 'worker' });
      const first = relay.runOnce();
      await until(() => calls === 1, 'the attempt to reach the endpoint');
      // The earlier version's claim, as it wrote it: its own lease, one more attempt, `claims` untouched.
      await pool.query(
        `UPDATE "${table}" SET attempts = attempts + 1, locked_by = 'worker', locked_until = now() + interval '1 minute'`,
      );
      release();
      expect(await first).toEqual({ claimed: 1, delivered: 0, retrying: 0, dead: 0, fenced: 1 });
      const [row] = await rows();
      expect(row).toMatchObject({ status: 'pending', attempts: 2, claims: 1, locked_by: 'worker' });
      expect(row.last_attempt).toBeNull();
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

  it('takes a URL object as its text, as sender.send() does, and refuses a URL object of another scheme', async () => {
    await clear();
    const url = new URL('https://receiver.test/hooks?tenant=a');
    expect(await outbox.add(pool, { id: 'url_object', url, body: '{}' })).toMatchObject({ id: 'url_object' });
    expect((await rows()).map((row) => [row.id, row.url])).toEqual([
      ['url_object', 'https://receiver.test/hooks?tenant=a'],
    ]);
    await expect(outbox.add(pool, { url: new URL('file:///etc/passwd'), body: '{}' })).rejects.toThrow(TypeError);
    expect(await rows()).toHaveLength(1);
  });

  describe('crash of a relay process (case 10)', () => {
    let child: ChildProcess | undefined;
    let endpoint: Endpoint | undefined;
    afterEach(async () => {
      child?.kill('SIGKILL');
      await endpoint?.close();
      child = endpoint = undefined;
    });
    const spawnRelay = (env: Record<string, string> = {}) =>
      spawn(
        process.execPath,
        ['--import', 'tsx', fileURLToPath(new URL('./fixtures/relay-process.ts', import.meta.url))],
        {
          cwd: root,
          env: { ...process.env, DATABASE_URL: databaseUrl, OUTBOX_TABLE: table, WEBHOOK_SECRET: SECRET, ...env },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
    // The database clock, as epoch ms: its now(), and each row's lease end.
    const databaseTimes = async () => {
      const { rows: times } = await pool.query(
        `SELECT id, floor(extract(epoch FROM locked_until) * 1000)::float8 AS lease_end,
                floor(extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now
           FROM "${table}"`,
      );
      return {
        now: times[0]?.now as number,
        leaseEnds: Object.fromEntries(times.map((time) => [time.id, time.lease_end])) as Record<string, number>,
      };
    };

    it('resumes after the lease: the receiver sees each id twice and applies it once', async () => {
      await clear();
      const { receiver, applied } = makeReceiver();
      endpoint = await startEndpoint(receiver);
      // The receiver applies every event but the acknowledgements never leave: the relay is stuck
      // mid-delivery when it dies.
      endpoint.setMode('hold');
      for (let i = 0; i < 5; i++) await outbox.add(pool, { id: `crash_${i}`, url: endpoint.url, body: { i } });
      child = spawnRelay();
      await until(() => applied.length === 5, 'the relay process to deliver all five');
      child.kill('SIGKILL');
      await new Promise((resolve) => child?.once('exit', resolve));
      const leased = await rows();
      expect(leased.every((row) => row.status === 'pending' && row.locked_by === 'crashing-relay')).toBe(true);

      endpoint.setMode('send');
      const survivor = outbox.relay({ db: pool, sender });
      // Still leased: nothing is taken over early.
      expect(await survivor.runOnce()).toMatchObject({ claimed: 0 });
      // The lease ends (moved by SQL, on the database clock, instead of waiting 60 s). The survivor
      // takes the rows over: each dead attempt counts as failed and waits out its backoff.
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      const before = await databaseTimes();
      expect(await survivor.runOnce()).toMatchObject({ claimed: 5, retrying: 5 });
      const after = await databaseTimes();
      expect([...endpoint.requests.values()]).toEqual([1, 1, 1, 1, 1]);
      // The takeover wrote down the dead relay's attempt: which one, under which claim and relay,
      // when its lease ended. It is no last_attempt: nothing came back.
      for (const row of await rows()) {
        expect(row).toMatchObject({ attempts: 1, last_attempt: null });
        expect(row.history).toEqual([
          {
            attempt: 1,
            result: 'lost',
            claim: 1,
            relayId: 'crashing-relay',
            leaseEndedAt: before.leaseEnds[row.id],
            takenOverAt: expect.any(Number),
          },
        ]);
        expect(row.history[0].takenOverAt).toBeGreaterThanOrEqual(before.now);
        expect(row.history[0].takenOverAt).toBeLessThanOrEqual(after.now);
      }
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      expect(await survivor.runOnce()).toMatchObject({ claimed: 5, delivered: 5 });
      expect(applied).toHaveLength(5);
      expect([...endpoint.requests.values()]).toEqual([2, 2, 2, 2, 2]);
      const delivered = await rows("status = 'delivered'");
      expect(delivered.length).toBe(5);
      // Every attempt counted has its entry: the lost one, then the delivery.
      for (const row of delivered) {
        expect(row.history.map((entry: { result: string }) => entry.result)).toEqual(['lost', 'delivered']);
        expect(row.history.map((entry: { attempt: number }) => entry.attempt)).toEqual([1, 2]);
        expect(row.attempts).toBe(row.history.length);
        expect(row.last_attempt).toEqual(row.history[1]);
      }
    });

    it('a takeover that dead-letters the row at maxAttempts records the lost attempt too', async () => {
      await clear();
      const { receiver, applied } = makeReceiver();
      endpoint = await startEndpoint(receiver);
      endpoint.setMode('hold');
      await outbox.add(pool, { id: 'only_once', url: endpoint.url, body: {} });
      // The relay process makes the only attempt allowed and dies waiting for the answer.
      child = spawnRelay({ OUTBOX_MAX_ATTEMPTS: '1' });
      await until(() => applied.length === 1, 'the relay process to make its attempt');
      child.kill('SIGKILL');
      await new Promise((resolve) => child?.once('exit', resolve));

      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      const { leaseEnds } = await databaseTimes();
      const once = createSender({ secret: SECRET, timeout: '5s', schedule: { maxAttempts: 1 } });
      expect(await outbox.relay({ db: pool, sender: once }).runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      expect(endpoint.requests.get('only_once')).toBe(1);
      const [dead] = (await outbox.deadLetters(pool)).rows;
      expect(dead).toMatchObject({ id: 'only_once', deadReason: 'max-attempts', attempts: 1, lastAttempt: null });
      expect(dead?.history).toEqual([
        {
          attempt: 1,
          result: 'lost',
          claim: 1,
          relayId: 'crashing-relay',
          leaseEndedAt: leaseEnds.only_once,
          takenOverAt: expect.any(Number),
        },
      ]);
      expect(dead?.attempts).toBe(dead?.history.length);
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

  it('the background loop starts the next round at once after a full batch, without waiting the poll interval', async () => {
    await clear();
    const { receiver, applied } = makeReceiver();
    const endpoint = await startEndpoint(receiver);
    try {
      for (const id of ['full_1', 'full_2', 'full_3']) await outbox.add(pool, { id, url: endpoint.url, body: '{}' });
      // A poll interval no test outlives: only the full-batch rule can deliver the three in time.
      const relay = outbox.relay({ db: pool, sender, batchSize: 1, pollInterval: '1h' });
      relay.start();
      await until(() => applied.length === 3, 'the loop to drain three full batches', 10_000);
      await relay.stop();
      expect([...applied].sort()).toEqual(['full_1', 'full_2', 'full_3']);
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

  it('requeue keeps created_at; the fresh horizon counts from requeued_at', async () => {
    await clear();
    let calls = 0;
    const server = await scripted((_request, response) => {
      calls++;
      response.statusCode = 500;
      response.end();
    });
    try {
      const hour = createSender({ secret: SECRET, timeout: '5s', schedule: { horizon: '1h' }, random: () => 0 });
      const relay = outbox.relay({ db: pool, sender: hour });
      await outbox.add(pool, { id: 'R1', url: server.url, body: '{}' });
      // An event added two hours ago that died at the horizon.
      await pool.query(
        `UPDATE "${table}" SET created_at = now() - interval '2 hours', status = 'dead', dead_reason = 'horizon', attempts = 3`,
      );
      const [before] = await rows();
      expect(await outbox.requeue(pool, 'R1')).toBe(true);
      let [row] = await rows();
      expect(row).toMatchObject({ status: 'pending', attempts: 0, created_at: before.created_at });
      expect(row.requeued_at).toBeInstanceOf(Date);
      // Two hours past created_at, yet inside the horizon that restarted at the requeue: a retry is
      // attempted and put back, not dead-lettered.
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      expect(calls).toBe(2);
      // The requeue's own horizon ends too.
      await pool.query(`UPDATE "${table}" SET requeued_at = now() - interval '2 hours', next_attempt_at = now()`);
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
      expect(calls).toBe(2);
      [row] = await rows();
      expect(row).toMatchObject({ status: 'dead', dead_reason: 'horizon', attempts: 2, created_at: before.created_at });
      const [after] = (await outbox.deadLetters(pool)).rows;
      expect(after?.createdAt).toEqual(before.created_at);
      expect(after?.requeuedAt).toEqual(row.requeued_at);
    } finally {
      await server.close();
    }
  });

  it('measures the horizon from the later of created_at and requeued_at: a requeue by the previous version is honoured', async () => {
    await clear();
    let calls = 0;
    const server = await scripted((_request, response) => {
      calls++;
      response.statusCode = 500;
      response.end();
    });
    try {
      const hour = createSender({ secret: SECRET, timeout: '5s', schedule: { horizon: '1h' }, random: () => 0 });
      await outbox.add(pool, { id: 'U1', url: server.url, body: '{}' });
      // Requeued by this version two hours ago, dead again, then requeued during a rolling upgrade by
      // the previous version, which restarts the horizon by moving created_at to now() and leaves
      // requeued_at as it was. The horizon restarted: a failed attempt is put back, not dead-lettered.
      await pool.query(`UPDATE "${table}" SET requeued_at = now() - interval '2 hours', created_at = now()`);
      expect(await outbox.relay({ db: pool, sender: hour }).runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
      expect(calls).toBe(1);
      expect((await rows())[0]).toMatchObject({ status: 'pending', dead_reason: null, attempts: 1 });
    } finally {
      await server.close();
    }
  });

  it('dead-letters a row whose takeovers die right after their claim too: at maxAttempts or the horizon, by the claim, without loading the body', async () => {
    await clear();
    let sent = 0;
    const dyingSender = (schedule: ScheduleOptions): Sender => ({
      ...createSender({ secret: SECRET, timeout: '5s', schedule, random: () => 0.5 }),
      attempt: () => {
        sent++;
        return new Promise<never>(() => undefined);
      },
    });
    // A relay process that dies right after its claim (say the row's body kills it): the claim
    // commits and returns, and no query after it ever does.
    const claimed: { id: string; body: unknown; crashed: boolean }[] = [];
    const diesAfterClaim = () => {
      let queries = 0;
      return {
        query: async (text: string, values?: unknown[]) => {
          if (queries++ > 0) return new Promise<never>(() => undefined);
          const result = await pool.query(text, values);
          claimed.push(...result.rows);
          return result;
        },
      };
    };
    const row = async () => (await rows())[0];
    const leaseEnds = () => pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);

    const thrice = dyingSender({ maxAttempts: 3 });
    await outbox.add(pool, { id: 'kills', url: 'https://receiver.test/hooks', body: '{"poison":true}' });
    void outbox.relay({ db: pool, sender: thrice, relayId: 'sends-then-dies' }).runOnce();
    await until(() => sent === 1, 'the first relay to start its attempt');
    await leaseEnds();
    for (let takeover = 1; takeover <= 2; takeover++) {
      void outbox.relay({ db: diesAfterClaim(), sender: thrice, relayId: `takeover-${takeover}` }).runOnce();
      await until(async () => (await row()).locked_by === `takeover-${takeover}`, `takeover ${takeover} to claim`);
      // Each takeover's claim counts: a row that kills relays before they send it still uses up attempts.
      expect(await row()).toMatchObject({ status: 'pending', attempts: 1 + takeover });
      await leaseEnds();
    }
    // The next claim finds the attempts used up and dead-letters the row itself: there is nothing
    // after the claim left to die in.
    const last = outbox.relay({ db: diesAfterClaim(), sender: thrice, relayId: 'takeover-3' }).runOnce();
    await until(async () => (await row()).locked_by !== 'takeover-2', 'the third takeover to claim');
    expect(await row()).toMatchObject({
      status: 'dead',
      dead_reason: 'max-attempts',
      attempts: 3,
      locked_by: null,
      locked_until: null,
    });
    expect(await last).toEqual({ claimed: 1, delivered: 0, retrying: 0, dead: 1, fenced: 0 });
    expect(sent).toBe(1);
    // Every claim that died left its entry, the ones that never sent anything too: the history
    // accounts for each attempt counted, and the claim that dead-lettered the row wrote the last one.
    const lost = (await row()).history;
    expect(lost.map(({ attempt, result, claim, relayId }: LostAttempt) => [attempt, result, claim, relayId])).toEqual([
      [1, 'lost', 1, 'sends-then-dies'],
      [2, 'lost', 2, 'takeover-1'],
      [3, 'lost', 3, 'takeover-2'],
    ]);
    expect((await row()).last_attempt).toBeNull();
    // A takeover never sends the row, so its claim does not load the body.
    expect(claimed.map((row) => [row.crashed, row.body])).toEqual([
      [true, null],
      [true, null],
      [true, null],
    ]);

    // Without maxAttempts (the default), the horizon ends it the same way.
    await clear();
    claimed.length = 0;
    await outbox.add(pool, { id: 'late', url: 'https://receiver.test/hooks', body: '{}' });
    await pool.query(
      `UPDATE "${table}" SET attempts = 7, locked_by = 'died', locked_until = now() - interval '1 second',
              created_at = now() - interval '2 hours'`,
    );
    const pastHorizon = outbox
      .relay({ db: diesAfterClaim(), sender: dyingSender({ horizon: '1h' }), relayId: 'takeover' })
      .runOnce();
    await until(async () => (await row()).locked_by !== 'died', 'the takeover to claim');
    expect(await row()).toMatchObject({ status: 'dead', dead_reason: 'horizon', attempts: 7, locked_by: null });
    expect((await row()).history).toMatchObject([{ attempt: 7, result: 'lost', relayId: 'died' }]);
    expect(await pastHorizon).toMatchObject({ claimed: 1, dead: 1 });
    expect(sent).toBe(1);
  });

  it('dead-letters a waiting row already at maxAttempts or past the horizon in its claim: no attempt, no body read, nothing after it', async () => {
    await clear();
    let sent = 0;
    const counting = (schedule: ScheduleOptions): Sender => {
      const real = createSender({ secret: SECRET, timeout: '5s', schedule });
      return {
        ...real,
        attempt: (...args) => {
          sent++;
          return real.attempt(...args);
        },
      };
    };
    // A relay that can run its claim and nothing after it: what the claim does not do stays undone.
    const claimed: { id: string; body: unknown; status: string }[] = [];
    const onlyTheClaim = {
      queries: 0,
      async query(text: string, values?: unknown[]) {
        if (this.queries++ > 0) throw new Error('a query after the claim');
        const result = await pool.query(text, values);
        claimed.push(...result.rows);
        return result;
      },
    };
    // Rows the relays fell behind on, or that a schedule shortened since has already ended: one
    // with its attempts used up, one attempted before and past the horizon.
    await outbox.add(pool, { id: 'behind', url: 'https://receiver.test/hooks', body: '{}' });
    await outbox.add(pool, { id: 'expired', url: 'https://receiver.test/hooks', body: '{}' });
    await pool.query(`UPDATE "${table}" SET attempts = 2 WHERE id = 'behind'`);
    await pool.query(
      `UPDATE "${table}" SET attempts = 1, created_at = now() - interval '2 hours' WHERE id = 'expired'`,
    );
    const relay = outbox.relay({ db: onlyTheClaim, sender: counting({ maxAttempts: 2, horizon: '1h' }) });
    expect(await relay.runOnce()).toEqual({ claimed: 2, delivered: 0, retrying: 0, dead: 2, fenced: 0 });
    expect(sent).toBe(0);
    expect(claimed.map(({ id, body, status }) => [id, body, status]).sort()).toEqual([
      ['behind', null, 'dead'],
      ['expired', null, 'dead'],
    ]);
    const [behind, expired] = await rows();
    expect(expired).toMatchObject({ status: 'dead', dead_reason: 'horizon', attempts: 1, locked_by: null });
    expect(behind).toMatchObject({ status: 'dead', dead_reason: 'max-attempts', attempts: 2, locked_by: null });
    expect([behind.history, expired.history]).toEqual([[], []]);
  });

  it('fences a claim made before a requeue out of a claim made after it under the same relayId', async () => {
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
      const first = outbox.relay({ db: pool, sender, relayId: 'worker' }).runOnce();
      await until(() => held.length === 1, 'the first attempt to reach the endpoint');
      // The relay stalls past its lease; meanwhile a 410 for another event of the same URL
      // dead-letters the row (what the relay does to every waiting row of a gone URL), and an
      // operator requeues it. The next claim, under the same relayId, has attempt count 1 again.
      await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
      await pool.query(
        `UPDATE "${table}" SET status = 'dead', dead_reason = 'gone', locked_until = NULL, locked_by = NULL`,
      );
      expect(await outbox.requeue(pool, 'E1')).toBe(true);
      const second = outbox.relay({ db: pool, sender, relayId: 'worker' }).runOnce();
      await until(() => held.length === 2, 'the attempt after the requeue to reach the endpoint');
      held[0]?.();
      // The stale 500 changes nothing: the claim after the requeue still holds the row.
      expect(await first).toEqual({ claimed: 1, delivered: 0, retrying: 0, dead: 0, fenced: 1 });
      expect((await rows())[0]).toMatchObject({ status: 'pending', locked_by: 'worker', attempts: 1 });
      held[1]?.();
      expect(await second).toMatchObject({ claimed: 1, delivered: 1, fenced: 0 });
      const [row] = await rows();
      expect(row).toMatchObject({ status: 'delivered', attempts: 1, locked_by: null });
      expect(row.history.map((attempt: { status: number }) => attempt.status)).toEqual([200]);
    } finally {
      for (const release of held) release();
      await server.close();
    }
  });

  it('backs off a row taken over from a dead relay as after a failed attempt, instead of sending it at once', async () => {
    await clear();
    let calls = 0;
    const server = await scripted((_request, response) => {
      calls++;
      response.statusCode = 200;
      response.end();
    });
    try {
      // random() = 0.5: every wait is half its ceiling, 30 s, 60 s, 120 s, ...
      const paced = createSender({ secret: SECRET, timeout: '5s', schedule: { base: '1m' }, random: () => 0.5 });
      // A relay that dies mid-attempt: its attempt never returns, so nothing is ever recorded.
      let started = 0;
      const dying: Sender = {
        ...paced,
        attempt: () => {
          started++;
          return new Promise<never>(() => undefined);
        },
      };
      const relay = outbox.relay({ db: pool, sender: paced });
      await outbox.add(pool, { id: 'poison', url: server.url, body: '{}' });
      for (let crash = 1; crash <= 4; crash++) {
        void outbox.relay({ db: pool, sender: dying, relayId: 'dies' }).runOnce();
        await until(() => started === crash, 'the dying relay to start its attempt');
        // Its lease runs out (on the database clock).
        await pool.query(`UPDATE "${table}" SET locked_until = now() - interval '1 second'`);
        expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 0, retrying: 1, dead: 0 });
        const { rows: waits } = await pool.query(
          `SELECT status, attempts, locked_by, extract(epoch FROM next_attempt_at - now())::float8 AS wait
             FROM "${table}"`,
        );
        expect(waits[0]).toMatchObject({ status: 'pending', attempts: crash, locked_by: null });
        const expected = 30 * 2 ** (crash - 1);
        expect(waits[0].wait).toBeGreaterThan(expected - 5);
        expect(waits[0].wait).toBeLessThanOrEqual(expected);
        // Not due: a relay polling now finds nothing.
        expect(await relay.runOnce()).toMatchObject({ claimed: 0 });
        // The wait is over.
        await pool.query(`UPDATE "${table}" SET next_attempt_at = now()`);
      }
      expect(calls).toBe(0);
      expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
      const [row] = await rows();
      expect(row).toMatchObject({ status: 'delivered', attempts: 5 });
      expect(row.last_attempt).toMatchObject({ attempt: 5 });
      expect(calls).toBe(1);
    } finally {
      await server.close();
    }
  });

  it('deadLetters pages by created_at and id, to the microsecond, with a cursor', async () => {
    await clear();
    const url = 'https://receiver.test/hooks';
    // d1 and d2 differ by one microsecond (one millisecond of a JavaScript Date); d3 and d4 tie.
    const dead: [string, string][] = [
      ['d4', '2026-01-01 00:00:00.000003+00'],
      ['d1', '2026-01-01 00:00:00.000001+00'],
      ['d5', '2026-01-01 00:00:01+00'],
      ['d3', '2026-01-01 00:00:00.000003+00'],
      ['d2', '2026-01-01 00:00:00.000002+00'],
    ];
    for (const [id, at] of dead) {
      await outbox.add(pool, { id, url, body: '{}' });
      await pool.query(`UPDATE "${table}" SET status = 'dead', dead_reason = 'gone', created_at = $2 WHERE id = $1`, [
        id,
        at,
      ]);
    }
    await outbox.add(pool, { id: 'alive', url, body: '{}' });
    const pages: string[][] = [];
    let page = await outbox.deadLetters(pool, { limit: 2 });
    for (;;) {
      pages.push(page.rows.map((row) => row.id));
      if (!page.next) break;
      page = await outbox.deadLetters(pool, { limit: 2, after: page.next });
    }
    expect(pages).toEqual([['d1', 'd2'], ['d3', 'd4'], ['d5']]);
    // A page that holds exactly the rest says there is no next one.
    const whole = await outbox.deadLetters(pool, { limit: 5 });
    expect(whole.rows).toHaveLength(5);
    expect(whole.next).toBeUndefined();
    // A row that dies after its place was read is not listed again; one past the cursor is.
    const first = await outbox.deadLetters(pool, { limit: 2 });
    await pool.query(`UPDATE "${table}" SET status = 'dead', created_at = '2026-01-02 00:00:00+00' WHERE id = 'alive'`);
    const rest = await outbox.deadLetters(pool, { limit: 10, after: first.next });
    expect(rest.rows.map((row) => row.id)).toEqual(['d3', 'd4', 'd5', 'alive']);

    await expect(outbox.deadLetters(pool, { after: 'not a cursor' })).rejects.toThrow(TypeError);
    // Tampered cursors: a wrong shape, and dates of the right shape that do not exist (PostgreSQL
    // would refuse them with a DatabaseError, 22008). Each is the documented TypeError.
    for (const createdAt of [
      '2026-01-01',
      '2026-13-45T99:99:99.999999',
      '0000-01-01T00:00:00.000000',
      '2026-02-30T00:00:00.000000',
      '2026-01-01T24:00:00.000000',
      '999999999-01-01T00:00:00.000000',
      '2026-01-01T00:00:00.00000x',
    ]) {
      const forged = Buffer.from(JSON.stringify([createdAt, 'd1'])).toString('base64url');
      await expect(outbox.deadLetters(pool, { after: forged }), createdAt).rejects.toThrow(TypeError);
    }
    // The first and the last instant a cursor can hold are read as such.
    for (const [createdAt, listed] of [
      ['0001-01-01T00:00:00.000000', 6],
      ['9999-12-31T23:59:59.999999', 0],
    ] as const) {
      const edge = Buffer.from(JSON.stringify([createdAt, 'd1'])).toString('base64url');
      expect((await outbox.deadLetters(pool, { after: edge })).rows, createdAt).toHaveLength(listed);
    }
    await expect(outbox.deadLetters(pool, { limit: 0 })).rejects.toThrow(TypeError);
    await expect(outbox.deadLetters(pool, { limit: 1.5 })).rejects.toThrow(TypeError);
  });

  it('migrate() brings a table of the previous version up to date, and leaves a current one unlocked', async () => {
    const legacy = uniqueTable('legacy');
    const server = await scripted((_request, response) => {
      response.statusCode = 200;
      response.end();
    });
    const holder = await pool.connect();
    const migrator = await pool.connect();
    try {
      // The schema of the previous version, with a row waiting and one left by a relay that died.
      await pool.query(`
        CREATE TABLE "${legacy}" (
          id text PRIMARY KEY, url text NOT NULL, body bytea NOT NULL,
          content_type text NOT NULL DEFAULT 'application/json', headers jsonb NOT NULL DEFAULT '{}'::jsonb,
          status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
          attempts integer NOT NULL DEFAULT 0, created_at timestamptz NOT NULL DEFAULT now(),
          next_attempt_at timestamptz NOT NULL DEFAULT now(), locked_until timestamptz, locked_by text,
          delivered_at timestamptz, dead_reason text, last_attempt jsonb, history jsonb NOT NULL DEFAULT '[]'::jsonb
        );
        INSERT INTO "${legacy}" (id, url, body) VALUES ('waiting', '${server.url}', '\\x7b7d');
        INSERT INTO "${legacy}" (id, url, body, attempts, locked_by, locked_until)
             VALUES ('orphan', '${server.url}', '\\x7b7d', 1, 'old-relay', now() - interval '1 second');
      `);
      const upgraded = createOutbox({ table: legacy });
      await Promise.all([upgraded.migrate(pool), upgraded.migrate(pool)]);
      const { rows: columns } = await pool.query(`SELECT id, claims, requeued_at FROM "${legacy}" ORDER BY id`);
      expect(columns).toEqual([
        { id: 'orphan', claims: 0, requeued_at: null },
        { id: 'waiting', claims: 0, requeued_at: null },
      ]);
      const round = await upgraded.relay({ db: pool, sender }).runOnce();
      expect(round).toMatchObject({ claimed: 2, delivered: 1, retrying: 1 });

      // Up to date now: another migrate() must not queue for a lock that conflicts with a writer's,
      // neither the exclusive one of ALTER TABLE nor the share one of CREATE INDEX IF NOT EXISTS
      // (every relay claim and every add() would queue behind it). So it passes an application
      // transaction that added an event and is still open.
      await holder.query('BEGIN');
      expect(await upgraded.add(holder, { id: 'open', url: server.url, body: '{}' })).toMatchObject({ added: true });
      await migrator.query(`SET lock_timeout = '500ms'`);
      await upgraded.migrate(migrator);
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined);
      holder.release();
      migrator.release(true);
      await pool.query(`DROP TABLE IF EXISTS "${legacy}"`);
      await server.close();
    }
  });

  it('a relay onAttempt that throws or rejects changes nothing; neither does an onError that rejects', async () => {
    await clear();
    const { receiver, applied } = makeReceiver();
    const endpoint = await startEndpoint(receiver);
    try {
      const observers = [
        () => {
          throw new Error('observer bug');
        },
        () => Promise.reject(new Error('observer bug')),
      ];
      for (const [i, onAttempt] of observers.entries()) {
        await outbox.add(pool, { id: `observed_${i}`, url: endpoint.url, body: '{}' });
        expect(await outbox.relay({ db: pool, sender, onAttempt }).runOnce()).toMatchObject({ delivered: 1 });
      }
      expect(applied).toEqual(['observed_0', 'observed_1']);
      expect((await rows("status <> 'delivered'")).length).toBe(0);
    } finally {
      await endpoint.close();
    }

    const errors: unknown[] = [];
    const relay = outbox.relay({
      db: { query: () => Promise.reject(new Error('connect ECONNREFUSED')) },
      sender,
      pollInterval: '10ms',
      onError: async (error) => {
        errors.push(error);
        throw new Error('an observer that rejects changes nothing');
      },
    });
    relay.start();
    await until(() => errors.length >= 2, 'two failed rounds to be reported');
    await relay.stop();
    expect(String(errors[1])).toMatch(/ECONNREFUSED/);
  });

  it('migrate() of one table named two ways at once: both succeed; a long name still gets its own indexes', async () => {
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
      // The due rows', one URL's waiting rows', the delivered and dead rows' that purge() walks, and
      // the dead rows' that deadLetters() pages through: five names, none cut.
      expect(
        indexes.map((index) => index.name.replace(/"/g, '').match(/_(dead_at|dead|delivered|due|url)$/)?.[1]).sort(),
      ).toEqual(['dead', 'dead_at', 'delivered', 'due', 'url']);
      for (const index of indexes) expect(index.name.replace(/"/g, '').length).toBeLessThanOrEqual(63);
    } finally {
      await pool.query(`DROP TABLE IF EXISTS "${short}", "${long}"`);
    }
  });

  it('refuses bad table names and options', () => {
    expect(() => createOutbox({ table: 'x; DROP TABLE y' })).toThrow(TypeError);
    expect(() => createOutbox({ table: 'a.b.c' })).toThrow(TypeError);
    expect(() => outbox.relay({ db: pool, sender, lease: '1s' })).toThrow(/timeout/);
    expect(() => outbox.relay({ db: pool, sender, batchSize: 0 })).toThrow(TypeError);
  });

  it('waits a pollInterval longer than one timer holds in full, in steps, instead of polling in a tight loop', async () => {
    const day = 86_400_000;
    // Only the wait is under test here: a database with nothing due answers every claim. From the
    // fourth claim on it holds the answer back, so a relay polling in a tight loop stalls there
    // (and fails below) instead of spinning through 29 days of 1 ms timers.
    let rounds = 0;
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (release = resolve));
    const db = {
      query: async () => {
        if (++rounds > 3) await held;
        return { rows: [], rowCount: 0 };
      },
    };
    const relay = outbox.relay({ db, sender, pollInterval: '30d' });
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      relay.start();
      // One timer would fire after 1 ms for this delay (Node clamps overlong delays to 1).
      await vi.advanceTimersByTimeAsync(29 * day);
      expect(rounds).toBe(1);
      await vi.advanceTimersByTimeAsync(day);
      expect(rounds).toBe(2);
      await relay.stop();
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      release();
      vi.useRealTimers();
      await relay.stop();
    }
  });

  it('the background loop leaves no abort listener behind after its idle polls (Node warns past 10)', async () => {
    await clear();
    // The loop's stop signal, found as the loop's first wait listens on it.
    const listen = vi.spyOn(EventTarget.prototype, 'addEventListener');
    const warnings = captureWarnings();
    // Listeners on the signal while a round runs, that is, between two waits.
    const between: number[] = [];
    const db = {
      query: (text: string, values?: unknown[]) => {
        const signal = listen.mock.contexts.find((target) => target instanceof AbortSignal);
        if (signal) between.push(getEventListeners(signal, 'abort').length);
        return pool.query(text, values);
      },
    };
    const relay = outbox.relay({ db, sender, pollInterval: '10ms' });
    try {
      relay.start();
      await until(() => between.length >= 25, '25 idle rounds');
    } finally {
      await relay.stop();
      listen.mockRestore();
      warnings.stop();
    }
    expect(Math.max(...between)).toBe(0);
    expect(warnings.all.filter((warning) => warning.name === 'MaxListenersExceededWarning')).toEqual([]);
  });
});
