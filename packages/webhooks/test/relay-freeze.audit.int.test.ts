// Audit: an outbox relay frozen (SIGSTOP: a Lambda freeze, `docker pause`, a long GC pause, a VM live
// migration) in the middle of an attempt, then thawed (SIGCONT). The relay runs in its own process
// (fixtures/relay-freeze-process.ts) on the real PostgreSQL; the endpoint is a real HTTP server in
// this process, which freezes the relay the moment the attempt reaches it and answers 200 at once:
// the answer waits, unread, in the frozen relay's socket.
import { type ChildProcess, spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('relay freeze audit');
const root = fileURLToPath(new URL('../../..', import.meta.url));
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until<T>(probe: () => T | Promise<T>, what: string, limitMs = 15_000): Promise<NonNullable<T>> {
  const started = performance.now();
  for (;;) {
    const value = await probe();
    if (value) return value as NonNullable<T>;
    if (performance.now() - started > limitMs) throw new Error(`timed out waiting for ${what}`);
    await pause(20);
  }
}

interface RelayChild {
  process: ChildProcess;
  lines: Record<string, unknown>[];
}

function spawnRelay(table: string, env: Record<string, string>): Promise<RelayChild> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', fileURLToPath(new URL('./fixtures/relay-freeze-process.ts', import.meta.url))],
    {
      cwd: root,
      env: { ...process.env, DATABASE_URL: databaseUrl, OUTBOX_TABLE: table, WEBHOOK_SECRET: SECRET, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  const relay: RelayChild = { process: child, lines: [] };
  let buffered = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    let end = buffered.indexOf('\n');
    while (end >= 0) {
      relay.lines.push(JSON.parse(buffered.slice(0, end)) as Record<string, unknown>);
      buffered = buffered.slice(end + 1);
      end = buffered.indexOf('\n');
    }
  });
  return until(() => relay.lines.some((line) => line.kind === 'ready'), 'the relay process', 40_000).then(() => relay);
}

describe.skipIf(!available)('outbox relay frozen mid-attempt', () => {
  const pool = testPool({ max: 4 });
  const table = uniqueTable('audit_freeze');
  const outbox = createOutbox({ table });
  let server: Server;
  let url: string;
  const arrivals = new Map<string, number>();
  // The relay process to freeze when the next attempt arrives.
  let freezeOnArrival: ChildProcess | undefined;
  let relay: RelayChild | undefined;

  beforeAll(async () => {
    await outbox.migrate(pool);
    server = createServer((request, response) => {
      const id = String(request.headers['webhook-id']);
      request.resume();
      request.on('end', () => {
        arrivals.set(id, (arrivals.get(id) ?? 0) + 1);
        const target = freezeOnArrival;
        freezeOnArrival = undefined;
        target?.kill('SIGSTOP');
        response.end('ok');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  });
  afterEach(async () => {
    // Never leave a stopped process behind.
    if (relay) {
      const child = relay.process;
      relay = undefined;
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGCONT');
        child.kill('SIGKILL');
        await exited;
      }
    }
    await pool.query(`DELETE FROM "${table}"`);
  });
  afterAll(async () => {
    await new Promise<void>((resolve) => server?.close(() => resolve()));
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  const row = async (id: string) =>
    (await pool.query(`SELECT status, attempts, claims, locked_by, history FROM "${table}" WHERE id = $1`, [id]))
      .rows[0];

  it('frozen past its per-attempt timeout but within its lease: the 200 that came during the freeze counts, the event is delivered once', async () => {
    const id = `evt_freeze_short_${Date.now()}`;
    await outbox.add(pool, { id, url, body: { id } });
    relay = await spawnRelay(table, { SENDER_TIMEOUT_MS: '500', RELAY_LEASE_MS: '5000' });
    freezeOnArrival = relay.process;
    await until(() => arrivals.get(id), 'the attempt to arrive');
    // Frozen longer than the sender's timeout (500 ms), shorter than the relay's lease (5 s).
    await pause(1_500);
    relay.process.kill('SIGCONT');
    const attempt = await until(
      () => relay?.lines.find((line) => line.kind === 'attempt' && line.id === id),
      "the relay's report of its attempt",
    );
    // Was wrong: the sender's timeout timer ran before the answer waiting in the socket was read, so
    // a delivered event was recorded as a timeout and sent again after its backoff.
    expect(attempt.result).toBe('delivered');
    expect((await row(id))?.status).toBe('delivered');
    expect(arrivals.get(id)).toBe(1);
  });

  it('frozen past its lease while another relay takes the row over: its late result is fenced, the takeover stands, the event is delivered again once (at least once)', async () => {
    const id = `evt_freeze_long_${Date.now()}`;
    await outbox.add(pool, { id, url, body: { id } });
    // A per-attempt timeout well above a loaded box's stalls: with 500 ms, a CI run once saw the
    // relay give its first attempt up before the endpoint (in this busy process) read it, and the
    // freeze caught a later claim (attempts 2, claims 4 at the takeover).
    relay = await spawnRelay(table, { SENDER_TIMEOUT_MS: '2500', RELAY_LEASE_MS: '3000' });
    freezeOnArrival = relay.process;
    await until(() => arrivals.get(id), 'the attempt to arrive');
    // Another relay (this process) takes the row over once the lease ends by the database's clock.
    // Its takeover backs the row off by a minute, so that the thawed relay never finds it due again
    // (a claim of its own, still in flight when it is killed, would hold the row for its lease).
    const survivor = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '500ms', schedule: { base: '1m', cap: '1h' } }),
      lease: '5s',
    });
    await until(async () => (await survivor.runOnce()).claimed > 0, 'the takeover');
    const taken = await row(id);
    // What the relay reported before its freeze, should this ever fail again.
    expect(taken, JSON.stringify(relay.lines)).toMatchObject({
      status: 'pending',
      attempts: 1,
      claims: 2,
      locked_by: null,
    });
    expect(taken.history).toEqual([expect.objectContaining({ result: 'lost', relayId: 'freezing-relay', claim: 1 })]);

    relay.process.kill('SIGCONT');
    // The thawed relay's round is past its lease: given up (relay_round_timeout), and its late
    // result, whatever it was, must change nothing.
    await until(
      () => relay?.lines.find((line) => line.kind === 'error' || line.kind === 'round'),
      "the thawed relay's round",
    );
    await until(() => relay?.lines.some((line) => line.kind === 'attempt' && line.id === id), 'its late attempt');
    const after = await row(id);
    expect(after).toMatchObject({ status: 'pending', attempts: 1, claims: 2, locked_by: null });
    expect(after.history).toHaveLength(1);
    const thawed = relay.process;
    const exited = new Promise((resolve) => thawed.once('exit', resolve));
    thawed.kill('SIGKILL');
    await exited;

    // The takeover's backoff is moved by SQL, not waited out; then the event is delivered again.
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now() WHERE id = $1`, [id]);
    expect(await survivor.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
    expect((await row(id))?.status).toBe('delivered');
    // Twice in all: the frozen relay's delivery (its answer fenced off) and the takeover's. That is
    // the documented at-least-once for a relay that stalled past its lease, and no more.
    expect(arrivals.get(id)).toBe(2);
  });
});
