// Audit: the outbox relay under realistic operations. Many endpoints, one of them slow or dead, a
// backlog to catch up, endpoints that throttle (429), redirect, hang or reset, relays that stop and
// start, lose their database connection, or run beside purge(). Real PostgreSQL (tables named
// `audit_relay_*`), real HTTP endpoints on ephemeral ports, real relays. Each "Was wrong" test
// states the behaviour expected; it was kept as it.fails until the decision it names was taken.
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duration } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, createVerifier, type Relay, type Sender } from '../src/index.js';
import { postgresAvailable, testPool } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('relay operations audit');

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

type Handler = (request: IncomingMessage, response: ServerResponse, id: string) => void;

/** A real endpoint that records when each webhook-id reached it, and answers as `handler` says. */
async function endpoint(handler: Handler = (_request, response) => response.end('ok')) {
  const arrivals = new Map<string, number[]>();
  const server = createServer((request, response) => {
    const id = String(request.headers['webhook-id']);
    // The body is read whole before the handler decides: a hanging endpoint has accepted it.
    request.resume();
    request.on('end', () => {
      arrivals.set(id, [...(arrivals.get(id) ?? []), Date.now()]);
      handler(request, response, id);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: `${base}/hooks`,
    base,
    arrivals,
    count: () => [...arrivals.values()].reduce((sum, times) => sum + times.length, 0),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// The endpoint that hangs: it takes the body and never answers, so every attempt runs to the timeout.
const hanging: Handler = () => undefined;

describe.skipIf(!available)('outbox relay under realistic operations', () => {
  const pool = testPool({ max: 20 });
  const table = `audit_relay_${randomBytes(4).toString('hex')}`;
  const outbox = createOutbox({ table });
  const closers: (() => Promise<unknown>)[] = [];
  const rows = async (where = 'true') =>
    (await pool.query(`SELECT * FROM "${table}" WHERE ${where} ORDER BY created_at, id`)).rows;

  /** Adds `count` events for `url` in one statement (a backlog, as a burst of business transactions leaves it). */
  const addMany = async (url: string, count: number, prefix: string) => {
    await pool.query(
      `INSERT INTO "${table}" (id, url, body) SELECT $2 || n, $1, convert_to('{"n":' || n || '}', 'UTF8')
         FROM generate_series(1, $3::int) AS n`,
      [url, prefix, count],
    );
    return Array.from({ length: count }, (_, n) => `${prefix}${n + 1}`);
  };

  const relays = (
    count: number,
    sender: Sender,
    options: { batchSize?: number; maxPerUrl?: number; lease?: Duration } = {},
  ) => {
    const started: Relay[] = [];
    for (let n = 0; n < count; n++) {
      const relay = outbox.relay({ db: pool, sender, pollInterval: '20ms', ...options });
      relay.start();
      started.push(relay);
    }
    const stop = () => Promise.all(started.map((relay) => relay.stop()));
    closers.push(stop);
    return { relays: started, stop };
  };

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  const clear = () => pool.query(`DELETE FROM "${table}"`);

  /**
   * One dead endpoint (it accepts the body and never answers) with a backlog of `deadBacklog` due
   * events, then one event for each of 4 healthy endpoints. Resolves to the worst latency of the
   * healthy events (from when they were added to when they arrived).
   */
  const healthyLatencyBehindADeadEndpoint = async (relayCount: number, deadBacklog: number) => {
    await clear();
    const dead = await endpoint(hanging);
    const healthy = await Promise.all([1, 2, 3, 4].map(() => endpoint()));
    closers.push(dead.close, ...healthy.map((h) => h.close));
    const sender = createSender({ secret: SECRET, timeout: '1s' });
    await addMany(dead.url, deadBacklog, 'evt_dead_');
    // Added a moment later, as the healthy endpoints' traffic goes on while the dead one's backlog waits.
    await sleep(5);
    const addedAt = Date.now();
    const ids = (await Promise.all(healthy.map((h, n) => addMany(h.url, 1, `evt_ok${n}_`)))).flat();
    const { stop } = relays(relayCount, sender, { lease: '3s' });
    try {
      await until(() => healthy.every((h) => h.count() >= 1), 'every healthy endpoint', 20_000);
      return Math.max(...healthy.flatMap((h) => ids.flatMap((id) => h.arrivals.get(id) ?? []))) - addedAt;
    } finally {
      await stop();
    }
  };

  // Was wrong: head-of-line blocking. A round claimed the `batchSize` rows due first, whatever their
  // endpoint, and the next round started only once every attempt of that one had ended. An endpoint
  // that accepts the body and never answers (or answers just under the timeout) held every round it
  // had a row in for the full timeout (15 s by default), and a backlog of its due rows filled whole
  // rounds: with 30 such rows ahead, the healthy endpoints' events waited 3 rounds of the timeout
  // (measured: about 3 s with a 1 s timeout; 45 s with the default). Standard Webhooks and Stripe give
  // each endpoint its own queue, so a dead one delays only itself. Decided: both. The loop keeps
  // `batchSize` attempts in flight and claims again as soon as one ends, and a claim gives one URL at
  // most `maxPerUrl` of them (default half), so the others go out through the rest.
  it("a dead endpoint's backlog does not hold up healthy endpoints (1 relay)", async () => {
    const latency = await healthyLatencyBehindADeadEndpoint(1, 30);
    console.info(`healthy latency behind a dead endpoint, 1 relay: ${latency} ms`);
    expect(latency).toBeLessThan(1000);
  });

  // Was wrong: as above; more relays only divided the backlog. Each of 3 relays claimed 10 of the 60
  // dead rows per round and waited out the timeout, so the healthy events waited 2 rounds (about 2 s
  // with a 1 s timeout, 30 s with the default). Decided: as above; the share is counted per relay.
  it("a dead endpoint's backlog does not hold up healthy endpoints (3 relays)", async () => {
    const latency = await healthyLatencyBehindADeadEndpoint(3, 60);
    console.info(`healthy latency behind a dead endpoint, 3 relays: ${latency} ms`);
    expect(latency).toBeLessThan(1000);
  });

  // Was wrong: the share bounded one dead endpoint, but two of them took half the slots each, all of
  // them, and every other endpoint's events waited out the timeout again, wave after wave. An
  // endpoint whose attempt got no answer now has one slot until one of its attempts is answered.
  it("two dead endpoints' backlogs do not hold up healthy endpoints once their first attempts timed out", async () => {
    await clear();
    const dead = [await endpoint(hanging), await endpoint(hanging)];
    const healthy = await Promise.all([1, 2, 3, 4].map(() => endpoint()));
    closers.push(...dead.map((d) => d.close), ...healthy.map((h) => h.close));
    for (const [n, d] of dead.entries()) await addMany(d.url, 30, `evt_dead${n}_`);
    const { stop } = relays(1, createSender({ secret: SECRET, timeout: '2s' }), { lease: '4s' });
    try {
      // Their first attempts (5 each) have timed out once another of theirs has gone out.
      await until(() => dead.every((d) => d.count() > 5), 'a second wave to the dead endpoints', 10_000);
      const addedAt = Date.now();
      const ids = (await Promise.all(healthy.map((h, n) => addMany(h.url, 1, `evt_alive${n}_`)))).flat();
      await until(() => healthy.every((h) => h.count() >= 1), 'every healthy endpoint', 10_000);
      const latency = Math.max(...healthy.flatMap((h) => ids.flatMap((id) => h.arrivals.get(id) ?? []))) - addedAt;
      console.info(`healthy latency behind two dead endpoints: ${latency} ms`);
      // One slot each while they give no answer: the second wave is one attempt each, not five (a
      // third may have begun on a slow machine, never a wave of five).
      for (const d of dead) expect(d.count()).toBeLessThanOrEqual(7);
      expect(latency).toBeLessThan(1000);
    } finally {
      await stop();
    }
  });

  // Was wrong: claims were first due, first claimed, whatever the endpoint, with no share per URL. A
  // backlog of 100 events for an endpoint that is up but slow (300 ms an answer) came first, and one
  // event for a fast endpoint added just after waited for all ten rounds of it (about 3 s), though the
  // fast endpoint takes it in a millisecond. Decided: as for the dead endpoint above; the slow
  // endpoint keeps its share of the slots, and the next claim, made at once, leaves it out.
  it("a slow endpoint's backlog does not make the next endpoint wait its turn", async () => {
    await clear();
    const slow = await endpoint((_request, response) => void setTimeout(() => response.end('ok'), 300));
    const fast = await endpoint();
    closers.push(slow.close, fast.close);
    await addMany(slow.url, 100, 'evt_slow_');
    await sleep(5);
    const addedAt = Date.now();
    await addMany(fast.url, 1, 'evt_fast_');
    const { stop } = relays(1, createSender({ secret: SECRET, timeout: '2s' }), { lease: '4s' });
    try {
      await until(() => fast.count() === 1, 'the fast endpoint');
    } finally {
      await stop();
    }
    const latency = (fast.arrivals.get('evt_fast_1')?.[0] ?? Number.NaN) - addedAt;
    console.info(`fast endpoint latency behind a slow one's backlog of 100: ${latency} ms`);
    expect(latency).toBeLessThan(1000);
  });

  /** An endpoint that answers after `ms`, and counts the requests it has open at once. */
  const concurrent = async (ms: number) => {
    let open = 0;
    let most = 0;
    const server = await endpoint((_request, response) => {
      open++;
      most = Math.max(most, open);
      setTimeout(() => {
        open--;
        response.end('ok');
      }, ms);
    });
    closers.push(server.close);
    return { ...server, most: () => most };
  };

  it("keeps one URL's attempts to its share of the slots (half by default), and that share busy when it is alone", async () => {
    await clear();
    const slow = await concurrent(100);
    await addMany(slow.url, 40, 'evt_share_');
    const { stop } = relays(1, createSender({ secret: SECRET, timeout: '2s' }), { lease: '4s' });
    try {
      await until(() => slow.count() === 40, 'the backlog');
    } finally {
      await stop();
    }
    // 10 slots, 5 for one URL: never more at once, and the share filled again as each ends.
    expect(slow.most()).toBe(5);
    const wider = await concurrent(100);
    await addMany(wider.url, 20, 'evt_wider_');
    const { stop: stopWider } = relays(1, createSender({ secret: SECRET, timeout: '2s' }), {
      lease: '4s',
      maxPerUrl: 10,
    });
    try {
      await until(() => wider.count() === 20, 'the second backlog');
    } finally {
      await stopWider();
    }
    expect(wider.most()).toBe(10);
  });

  it('runOnce() claims at most maxPerUrl rows of one URL, and fills the batch from the others', async () => {
    await clear();
    const first = await endpoint();
    const second = await endpoint();
    closers.push(first.close, second.close);
    await addMany(first.url, 20, 'evt_round_a_');
    await sleep(5);
    await addMany(second.url, 20, 'evt_round_b_');
    const sender = createSender({ secret: SECRET, timeout: '1s' });
    expect(await outbox.relay({ db: pool, sender, maxPerUrl: 4 }).runOnce()).toMatchObject({
      claimed: 8,
      delivered: 8,
    });
    expect([first.count(), second.count()]).toEqual([4, 4]);
    expect(await outbox.relay({ db: pool, sender, batchSize: 12 }).runOnce()).toMatchObject({ claimed: 12 });
    expect([first.count(), second.count()]).toEqual([10, 10]);
  });

  // Was wrong: a 429 with Retry-After was honoured only for the event it answered; the relay went on
  // sending every other waiting event of that URL at full speed (40 due events brought 40 requests,
  // each answered 429). Standard Webhooks lists 429 as "throttle", and Svix holds the endpoint back.
  // Decided: a 429, or any status with a Retry-After, holds the URL's other waiting events as long as
  // the answered one waits; only the events already in flight (one round's) still arrive.
  it("a 429 with Retry-After holds back the URL's other waiting events, not just the one it answered", async () => {
    await clear();
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '60' });
      response.end('slow down');
    });
    closers.push(throttled.close);
    await addMany(throttled.url, 40, 'evt_429_');
    const sender = createSender({ secret: SECRET, timeout: '1s' });
    const { stop } = relays(1, sender, { lease: '3s' });
    try {
      await until(() => throttled.count() >= 1, 'the first 429');
      // Rounds of 10 go back to back: give the relay time for the rest of the backlog.
      await until(
        async () => (await rows("status = 'pending' AND attempts = 0")).length === 0,
        'every row tried',
        3000,
      ).catch(() => undefined);
    } finally {
      await stop();
    }
    console.info(`requests to an endpoint that answered 429 Retry-After: 60: ${throttled.count()}`);
    expect(throttled.count()).toBeLessThanOrEqual(10);
  });

  // How far the waiting rows of `url` were put off, in seconds from now, smallest first.
  const heldFor = async (url: string) =>
    (
      await pool.query(
        `SELECT extract(epoch FROM next_attempt_at - now())::float8 AS s FROM "${table}"
          WHERE url = $1 AND attempts = 0 ORDER BY s`,
        [url],
      )
    ).rows.map((row: { s: number }) => row.s);

  it.each([
    [429, 'without Retry-After: the backoff the answered event got', {}],
    [503, 'with Retry-After, longer than the backoff', { 'retry-after': '900' }],
  ] as const)("%i holds the URL's other waiting events (%s), never another URL's", async (status, _why, headers) => {
    await clear();
    const throttled = await endpoint((_request, response) => {
      response.writeHead(status, headers);
      response.end();
    });
    const other = await endpoint((_request, response) => {
      response.writeHead(status, headers);
      response.end();
    });
    closers.push(throttled.close, other.close);
    await addMany(throttled.url, 1, 'evt_first_');
    await sleep(5);
    await addMany(throttled.url, 4, 'evt_held_');
    await addMany(other.url, 2, 'evt_other_');
    // Backoff waits of 5 minutes (half the 10-minute ceiling), well clear of a round's own time.
    const sender = createSender({ secret: SECRET, timeout: '1s', schedule: { base: '10m' }, random: () => 0.5 });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '3s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const [first] = await rows("id = 'evt_first_1'");
    const waitedS = first.last_attempt.waitMs / 1000;
    const held = await heldFor(throttled.url);
    expect(held).toHaveLength(4);
    expect(waitedS).toBe(status === 429 ? 300 : 900);
    for (const seconds of held) expect(seconds).toBeGreaterThan(waitedS - 5);
    // Another URL is not held, and nothing was attempted or counted for the held events.
    expect((await heldFor(other.url)).every((seconds) => seconds <= 0)).toBe(true);
    expect((await rows(`url = '${throttled.url}' AND attempts > 0`)).map((row) => row.id)).toEqual(['evt_first_1']);
    expect(throttled.count()).toBe(1);
  });

  it("a 500 without Retry-After holds nothing: the URL's other events are still tried at once", async () => {
    await clear();
    const failing = await endpoint((_request, response) => {
      response.writeHead(500);
      response.end();
    });
    closers.push(failing.close);
    await addMany(failing.url, 1, 'evt_first_');
    await sleep(5);
    await addMany(failing.url, 2, 'evt_next_');
    const relay = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '1s' }),
      batchSize: 1,
      lease: '3s',
    });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    expect((await heldFor(failing.url)).every((seconds) => seconds <= 0)).toBe(true);
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    expect(failing.count()).toBe(2);
  });

  it("honours each event's Retry-After: its next attempt waits at least that long, by the database's clock", async () => {
    await clear();
    const throttled = await endpoint((_request, response) => {
      response.writeHead(503, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await addMany(throttled.url, 3, 'evt_503_');
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '1s' }), lease: '3s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 3, retrying: 3 });
    for (const row of await rows()) {
      const waited = (
        await pool.query(`SELECT extract(epoch FROM next_attempt_at - now()) AS s FROM "${table}" WHERE id = $1`, [
          row.id,
        ])
      ).rows[0].s;
      expect(Number(waited)).toBeGreaterThan(110);
      expect(row.last_attempt).toMatchObject({ status: 503, retryAfterMs: 120_000, waitMs: 120_000 });
    }
  });

  it('410 dead-letters the waiting events of that URL only: not another path or query of the same host', async () => {
    await clear();
    const gone = await endpoint((request, response) => {
      response.writeHead(request.url === '/hooks' ? 410 : 503);
      response.end();
    });
    closers.push(gone.close);
    await addMany(gone.url, 1, 'evt_gone_first_');
    await sleep(5);
    await addMany(gone.url, 5, 'evt_gone_');
    await addMany(`${gone.base}/other`, 3, 'evt_other_');
    await addMany(`${gone.url}?tenant=2`, 3, 'evt_query_');
    const relay = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '1s' }),
      batchSize: 1,
      lease: '3s',
    });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 6 });
    const all = await rows();
    expect(all.filter((row) => row.status === 'dead').map((row) => row.dead_reason)).toEqual(Array(6).fill('gone'));
    expect(all.filter((row) => row.url !== gone.url).every((row) => row.status === 'pending')).toBe(true);
    // Only the first was sent: the others learnt of the 410 without a request.
    expect(gone.count()).toBe(1);
  });

  it('a redirect is a failed attempt and is not followed; the target gets nothing', async () => {
    await clear();
    const target = await endpoint();
    const redirecting = await endpoint((_request, response) => {
      response.writeHead(307, { location: target.url });
      response.end();
    });
    closers.push(target.close, redirecting.close);
    await addMany(redirecting.url, 1, 'evt_redirect_');
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '1s' }), lease: '3s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const [row] = await rows();
    expect(row.last_attempt).toMatchObject({ result: 'failed', status: 307 });
    expect(target.count()).toBe(0);
  });

  it('tells a receiver that took the body and never answered (timeout) from one that reset the connection', async () => {
    await clear();
    const silent = await endpoint(hanging);
    const resetting = await endpoint((request) => request.socket.destroy());
    closers.push(silent.close, resetting.close);
    await addMany(silent.url, 1, 'evt_silent_');
    await addMany(resetting.url, 1, 'evt_reset_');
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '500ms' }), lease: '3s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 2, retrying: 2 });
    const byId = new Map((await rows()).map((row) => [row.id, row]));
    expect(byId.get('evt_silent_1')?.last_attempt).toMatchObject({ result: 'timeout' });
    expect(byId.get('evt_reset_1')?.last_attempt).toMatchObject({ result: 'network-error' });
    expect([...byId.values()].every((row) => row.status === 'pending' && row.locked_by === null)).toBe(true);
    expect(silent.count() + resetting.count()).toBe(2);
  });

  it('stop() waits for the attempt in flight and leaves its row recorded; a start() after it runs again', async () => {
    await clear();
    const silent = await endpoint(hanging);
    const healthy = await endpoint();
    closers.push(silent.close, healthy.close);
    await addMany(silent.url, 1, 'evt_stop_');
    const relay = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '700ms' }),
      lease: '3s',
      pollInterval: '20ms',
    });
    relay.start();
    await until(() => silent.count() === 1, 'the attempt in flight');
    await relay.stop();
    // The row proves that stop() waited: its attempt is recorded only when the sender's 700 ms
    // timeout ends it. A bound on stop()'s own duration, measured from when the 10 ms poll saw the
    // arrival, said nothing more and failed on a loaded box, where that poll came late.
    const [row] = await rows();
    expect(row).toMatchObject({ status: 'pending', locked_by: null, attempts: 1 });
    expect(row.last_attempt).toMatchObject({ result: 'timeout' });
    await addMany(healthy.url, 1, 'evt_restart_');
    relay.start();
    closers.push(() => relay.stop());
    await until(() => healthy.count() === 1, 'the restarted relay');
    await relay.stop();
  });

  // 3,000 events: 10,000 took 25 s on CI's shared box (beside the other integration files), past
  // the budget; the rate is what the figure is for. The lease is long so that a round slowed by that
  // load is never taken over, and the timeout long so that an answer slowed by it is not taken for
  // a failure: either would send events twice (at least once is the contract, not this test's point).
  it('catches up a backlog of 3,000 events with 3 relays, each event once, and reports the rate', async () => {
    await clear();
    const healthy = await endpoint();
    closers.push(healthy.close);
    const ids = await addMany(healthy.url, 3_000, 'evt_backlog_');
    const started = Date.now();
    const { stop } = relays(3, createSender({ secret: SECRET, timeout: '20s' }), { batchSize: 50, lease: '30s' });
    try {
      await until(() => healthy.arrivals.size === ids.length, 'the backlog', 40_000);
    } finally {
      await stop();
    }
    const took = Date.now() - started;
    console.info(`3,000 events, 3 relays, batchSize 50: ${took} ms (${Math.round(3_000 / (took / 1000))}/s)`);
    expect(healthy.count()).toBe(ids.length);
    expect((await pool.query(`SELECT count(*)::int AS n FROM "${table}" WHERE status = 'delivered'`)).rows[0].n).toBe(
      ids.length,
    );
  }, 50_000);

  it('spreads the retries of a backlog that failed together: no stampede when the endpoint comes back', async () => {
    await clear();
    let up = false;
    const flapping = await endpoint((_request, response) => {
      response.writeHead(up ? 200 : 503);
      response.end();
    });
    closers.push(flapping.close);
    await addMany(flapping.url, 200, 'evt_outage_');
    const relay = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '1s', schedule: { base: '2s' } }),
      batchSize: 200,
      // One endpoint: the whole backlog in one round, as it failed together.
      maxPerUrl: 200,
      lease: '3s',
    });
    expect(await relay.runOnce()).toMatchObject({ claimed: 200, retrying: 200 });
    up = true;
    // The database's schedule, read rather than waited out: every retry within [now, now + 2 s), spread.
    const { rows: waits } = await pool.query(
      `SELECT floor(extract(epoch FROM next_attempt_at - now()) * 10)::int AS bucket, count(*)::int AS n
         FROM "${table}" GROUP BY 1`,
    );
    expect(Math.max(...waits.map((w) => w.bucket))).toBeLessThan(20);
    expect(Math.max(...waits.map((w) => w.n))).toBeLessThanOrEqual(30); // of 200 in 20 buckets of 100 ms
  });

  // What holds: no event is lost. A result write that meets a connection the pool has not yet seen
  // die is tried again (the next test makes that happen for certain); should every try fail, the row
  // is taken over once its lease ends and sent again (at least once, as docs/webhooks.md says for a
  // relay that dies mid-delivery), so the test asserts the guarantee, not the count.
  it('a relay whose database connections are cut mid-round loses no event', async () => {
    await clear();
    const name = `audit_relay_cut_${randomBytes(3).toString('hex')}`;
    const relayPool = testPool({ max: 4, application_name: name });
    closers.push(() => relayPool.end());
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const slow = await endpoint((_request, response) => void held.then(() => response.end('ok')));
    closers.push(slow.close);
    await addMany(slow.url, 5, 'evt_cut_');
    const errors: unknown[] = [];
    const relay = outbox.relay({
      db: relayPool,
      sender: createSender({ secret: SECRET, timeout: '2s' }),
      lease: '4s',
      pollInterval: '20ms',
      onError: (error) => void errors.push(error),
    });
    relay.start();
    closers.push(() => relay.stop());
    await until(() => slow.arrivals.size === 5, 'the attempts in flight');
    const { rowCount } = await pool.query(
      'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1',
      [name],
    );
    expect(rowCount).toBeGreaterThan(0);
    release();
    await until(async () => (await rows("status = 'delivered'")).length === 5, 'every result recorded', 30_000);
    await relay.stop();
    expect(slow.arrivals.size).toBe(5);
    expect(slow.count()).toBeGreaterThanOrEqual(5);
  });

  // Was wrong: a result write that met a dead connection was lost, and the row was sent again once
  // its lease ended (a second delivery for an attempt that had worked). The write is fenced, so the
  // relay now tries it again on another connection. Deterministic: the first result write is sent on
  // a connection whose server process was terminated before it, a real "connection terminated".
  it('a result write that meets a dead connection is written again: the event is sent once', async () => {
    await clear();
    const target = await endpoint();
    closers.push(target.close);
    await addMany(target.url, 1, 'evt_deadconn_');
    let cut = 0;
    const db = {
      query: async (text: string, values?: unknown[]) => {
        if (cut > 0 || !text.includes('last_attempt =')) return pool.query(text, values);
        cut++;
        const client = await pool.connect();
        client.on('error', () => undefined);
        const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
        await pool.query('SELECT pg_terminate_backend($1)', [pid]);
        await until(
          async () => (await pool.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rowCount === 0,
          'the backend to end',
        );
        try {
          return await client.query(text, values);
        } finally {
          client.release(true);
        }
      },
    };
    const relay = outbox.relay({ db, sender: createSender({ secret: SECRET, timeout: '2s' }), lease: '3s' });
    const round = await relay.runOnce();
    expect(cut).toBe(1);
    expect(round.claimed).toBe(1);
    const [row] = await rows();
    expect(row.status).toBe('delivered');
    expect(row.locked_by).toBeNull();
    expect(target.count()).toBe(1);
  });

  it('relays with clocks an hour apart schedule by the database clock alone', async () => {
    await clear();
    let failing = true;
    const flaky = await endpoint((_request, response) => {
      response.writeHead(failing ? 503 : 200);
      response.end();
    });
    closers.push(flaky.close);
    await addMany(flaky.url, 10, 'evt_clock_');
    const ahead = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '1s', now: () => Date.now() + 3_600_000 }),
      batchSize: 5,
      lease: '3s',
    });
    const behind = outbox.relay({
      db: pool,
      sender: createSender({ secret: SECRET, timeout: '1s', now: () => Date.now() - 3_600_000 }),
      batchSize: 5,
      lease: '3s',
    });
    await Promise.all([ahead.runOnce(), behind.runOnce()]);
    const { rows: waits } = await pool.query(
      `SELECT extract(epoch FROM next_attempt_at - now()) AS s FROM "${table}" WHERE status = 'pending'`,
    );
    expect(waits).toHaveLength(10);
    for (const { s } of waits) expect(Number(s)).toBeLessThan(1.5);
    failing = false;
    await until(async () => {
      await Promise.all([ahead.runOnce(), behind.runOnce()]);
      return (await rows("status = 'delivered'")).length === 10;
    }, 'every event delivered by either relay');
  });

  // Was wrong: the relay signed webhook-timestamp by its host's clock, so a relay an hour off had
  // every delivery refused by receivers (timestamp_too_old / too_new) while the database scheduled
  // it correctly; it signs by the database's clock now, as it schedules.
  it("signs by the database's clock: relays an hour off are accepted by a verifying receiver", async () => {
    await clear();
    const verifier = createVerifier({ secret: SECRET });
    const refusals: string[] = [];
    const strict = await new Promise<{ url: string; close: () => Promise<void> }>((resolve) => {
      const server = createServer((request, response) => {
        const chunks: Buffer[] = [];
        request.on('data', (chunk: Buffer) => chunks.push(chunk));
        request.on('end', () => {
          const result = verifier.verify({ headers: request.headers, body: Buffer.concat(chunks) });
          if (!result.ok) refusals.push(result.error.code);
          response.writeHead(result.ok ? 204 : 400);
          response.end();
        });
      });
      server.listen(0, '127.0.0.1', () =>
        resolve({
          url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
          close: () => new Promise<void>((done) => server.close(() => done())),
        }),
      );
    });
    closers.push(strict.close);
    await addMany(strict.url, 6, 'evt_signclock_');
    for (const offset of [3_600_000, -3_600_000]) {
      const relay = outbox.relay({
        db: pool,
        sender: createSender({ secret: SECRET, timeout: '1s', now: () => Date.now() + offset }),
        batchSize: 3,
        maxPerUrl: 3,
        lease: '3s',
      });
      expect(await relay.runOnce()).toMatchObject({ claimed: 3, delivered: 3 });
    }
    expect(refusals).toEqual([]);
    // The history dates each attempt by the same clock: within a few seconds of the database's.
    const { rows: dated } = await pool.query(
      `SELECT abs((last_attempt->>'startedAt')::float8 - extract(epoch FROM now()) * 1000) AS off FROM "${table}"`,
    );
    expect(dated).toHaveLength(6);
    for (const { off } of dated) expect(Number(off)).toBeLessThan(60_000);
  });

  it('purge() beside 3 relays and a 410: deletes only what ended, never an event still to send', async () => {
    await clear();
    const healthy = await endpoint();
    const gone = await endpoint((_request, response) => {
      response.writeHead(410);
      response.end();
    });
    closers.push(healthy.close, gone.close);
    const ids = await addMany(healthy.url, 600, 'evt_purge_ok_');
    await addMany(gone.url, 100, 'evt_purge_gone_');
    const { stop } = relays(3, createSender({ secret: SECRET, timeout: '1s' }), { lease: '3s' });
    const controller = new AbortController();
    let purged = 0;
    const purging = (async () => {
      while (!controller.signal.aborted) {
        purged += (await outbox.purge(pool, { olderThan: 0, dead: true, batchSize: 7 })).deleted;
        await sleep(5);
      }
    })();
    try {
      await until(() => healthy.arrivals.size === ids.length, 'every healthy event');
      await until(async () => (await rows("status = 'pending'")).length === 0, 'nothing pending');
    } finally {
      controller.abort();
      await purging;
      await stop();
    }
    purged += (await outbox.purge(pool, { olderThan: 0, dead: true })).deleted;
    expect(healthy.count()).toBe(ids.length);
    expect(purged).toBe(700);
    expect(await rows()).toEqual([]);
  });
});
