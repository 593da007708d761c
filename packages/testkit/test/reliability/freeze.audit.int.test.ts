// Audit: process freeze and thaw (SIGSTOP/SIGCONT). What AWS Lambda's freeze between invocations, a
// long GC pause, a VM live migration, a closed laptop lid or `docker pause` do to a running server:
// the process stops at an arbitrary instruction, every timer and socket with it, while the store's
// clock and the other processes go on. On SIGCONT it resumes where it stopped, its monotonic clock
// (CLOCK_MONOTONIC, system-wide) jumped by the freeze, its overdue timers all due at once.
//
// Real worker processes (fixtures/freeze-worker.ts) on real Redis and PostgreSQL, with a 1 s lease.
// Worker 0 freezes itself at a point its request names; worker 1 takes the key over with the same
// request once the store lets the lease go (the test polls for that, it never sleeps out a TTL); then
// worker 0 is thawed. The handler follows the documented pattern: it checks its signal before its
// effect and passes `keyFor('charge')` to a downstream payment service (a real HTTP server in this
// process that keeps one payment per idempotency key and counts the calls).
import { existsSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startWorkers, type Worker, type Workers } from '../../src/workers.js';
import {
  type Backend,
  type BackendKind,
  backendKinds,
  createBackend,
  pause,
  postgresAvailable,
  redisAvailable,
  startTogether,
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
// A stopped process is told by its state in /proc (Linux): elsewhere these scenarios are skipped.
const procfs = existsSync('/proc/self/stat');
const runs = (kind: BackendKind) => procfs && (kind === 'redis' ? available.redis : available.postgres);
const freezeWorker = fileURLToPath(new URL('./fixtures/freeze-worker.ts', import.meta.url));
const leaseMs = 1000;
// The four blocks below (three stores on Express, then Fastify and Koa on Redis) run at once, each
// with its own workers, table or prefix and keys, and begin together once every worker has started.
// Within a block the tests stay in order: they freeze and thaw the same worker 0.
const together = startTogether(backendKinds.filter(runs).length + (procfs && available.redis ? 1 : 0));

/** The downstream payment service: one payment per idempotency key, every call counted per request key. */
interface Payments {
  url: string;
  calls(key: string): number;
  payments(key: string): number;
  close(): Promise<void>;
}

async function startPayments(): Promise<Payments> {
  const byIdempotencyKey = new Map<string, string>();
  const calls = new Map<string, number>();
  const paid = new Map<string, Set<string>>();
  let next = 0;
  const server: Server = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => {
      body += chunk.toString();
    });
    req.on('end', () => {
      const { key } = JSON.parse(body) as { key: string };
      const idempotencyKey = String(req.headers['idempotency-key']);
      calls.set(key, (calls.get(key) ?? 0) + 1);
      let payment = byIdempotencyKey.get(idempotencyKey);
      if (payment === undefined) {
        payment = `pay_${++next}`;
        byIdempotencyKey.set(idempotencyKey, payment);
        const set = paid.get(key) ?? new Set<string>();
        set.add(payment);
        paid.set(key, set);
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ payment }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/pay`,
    calls: (key) => calls.get(key) ?? 0,
    payments: (key) => paid.get(key)?.size ?? 0,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

interface Reply {
  status: number;
  headers: Headers;
  body: string;
  json: Record<string, unknown>;
}

/** POSTs the one charge request of `key` (always the same body, so a retry is the same request). */
async function post(url: string, key: string, headers: Record<string, string> = {}): Promise<Reply> {
  try {
    const response = await fetch(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json', ...headers },
      body: '{"amount":4200}',
      signal: AbortSignal.timeout(20_000),
    });
    const body = await response.text();
    let json: Record<string, unknown> = {};
    try {
      json = JSON.parse(body) as Record<string, unknown>;
    } catch {}
    return { status: response.status, headers: response.headers, body, json };
  } catch {
    return { status: 0, headers: new Headers(), body: '', json: {} };
  }
}

/** Retries `key` on `url` every 50 ms while it is in progress (409) or the store is unavailable (503). */
async function retryUntilSettled(
  url: string,
  key: string,
  limitMs = 20_000,
): Promise<{ reply: Reply; seen: number[] }> {
  const started = performance.now();
  const seen: number[] = [];
  for (;;) {
    const reply = await post(url, key);
    seen.push(reply.status);
    if ((reply.status !== 409 && reply.status !== 503) || performance.now() - started > limitMs) return { reply, seen };
    await pause(50);
  }
}

/** The process state letter of /proc/<pid>/stat: 'T' when stopped. */
function procState(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  } catch {
    return '?';
  }
}

async function waitFrozen(worker: Worker, limitMs = 15_000): Promise<void> {
  const pid = worker.process.pid as number;
  const started = performance.now();
  while (procState(pid) !== 'T') {
    if (performance.now() - started > limitMs) throw new Error(`worker ${worker.index} never froze:\n${worker.output}`);
    await pause(10);
  }
}

function thaw(worker: Worker | undefined): void {
  const pid = worker?.process.pid;
  if (pid !== undefined && worker?.process.exitCode === null) {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {}
  }
}

async function eventsOf(worker: Worker): Promise<Record<string, number>> {
  const response = await fetch(`${worker.url}/stats`, { headers: { connection: 'close' } });
  return ((await response.json()) as { events: Record<string, number> }).events;
}

/**
 * The events `worker` reported since `before`, once its report has settled: a completion that failed
 * is retried in the background, so this waits (polling) for a `complete` or a fenced `lease-lost`.
 */
async function settledEvents(worker: Worker, before: Record<string, number>): Promise<Record<string, number>> {
  let events = await deltaEvents(worker, before);
  for (let i = 0; i < 40 && !events.complete && !events['lease-lost:fenced']; i++) {
    await pause(100);
    events = await deltaEvents(worker, before);
  }
  return events;
}

/** The events `worker` reported since `before`. */
async function deltaEvents(worker: Worker, before: Record<string, number>): Promise<Record<string, number>> {
  const now = await eventsOf(worker);
  return Object.fromEntries(Object.entries(now).map(([name, n]) => [name, n - (before[name] ?? 0)]));
}

/** Polls the store until the record of `key` is abandoned (its lease ended, nothing stored), or fails. */
async function abandoned(backend: Backend, key: string, limitMs = 2 * leaseMs + 3_000): Promise<void> {
  const started = performance.now();
  for (;;) {
    const record = await backend.record(key);
    if (record?.state === 'abandoned') return;
    if (record?.state === 'completed' || performance.now() - started > limitMs)
      throw new Error(`the record of ${key} is ${record?.state}, not abandoned`);
    await pause(50);
  }
}

let payments: Payments;
beforeAll(async () => {
  payments = await startPayments();
});
afterAll(async () => {
  await payments?.close();
});

let counter = 0;
const freshKey = (label: string) => `freeze-${label}-${process.pid}-${Date.now()}-${++counter}`;

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`process freeze on ${kind} (express)`, { concurrent: true }, () => {
    let backend: Backend;
    let group: Workers;

    beforeAll(() =>
      together(async () => {
        backend = await createBackend(kind, 'audit_freeze');
        group = await startWorkers({
          count: 2,
          script: freezeWorker,
          readyTimeoutMs: 40_000,
          env: () => ({
            ...backend.env(),
            FRAMEWORK: 'express',
            LEASE_MS: String(leaseMs),
            STORE_TIMEOUT_MS: '2000',
            DOWNSTREAM_URL: payments.url,
          }),
        });
      }),
    );
    // A stopped child must never outlive its test: thaw it whatever happened.
    afterEach(() => {
      for (const worker of group?.workers ?? []) thaw(worker);
    });
    afterAll(async () => {
      for (const worker of group?.workers ?? []) thaw(worker);
      await group?.close();
      await backend?.close();
    });

    it.sequential('frozen before its effect past the lease: the takeover runs once, the thawed run sees its lease lost and makes no effect, its completion is fenced', async () => {
      const [w0, w1] = group.workers as [Worker, Worker];
      const key = freshKey('before');
      const before = await eventsOf(w0);
      const frozen = post(w0.url, key, { 'x-freeze-at': 'before-effect' });
      await waitFrozen(w0);
      const { reply: taken, seen } = await retryUntilSettled(w1.url, key);
      expect(taken.status).toBe(201);
      expect(taken.json.worker).toBe(1);
      // The store held the key for the frozen lease first: refused (409), never run alongside.
      expect(seen.filter((s) => s === 409).length).toBeGreaterThan(0);
      thaw(w0);
      const late = await frozen;

      // At most once: the thawed handler read its signal as aborted and stopped before its effect.
      expect(await backend.effects(key)).toBe(1);
      expect(payments.calls(key)).toBe(1);
      expect(payments.payments(key)).toBe(1);
      // Its completion never overwrote the takeover's stored response.
      const record = await backend.record(key);
      expect(record?.state).toBe('completed');
      if (record?.state === 'completed')
        expect(JSON.parse(Buffer.from(record.response.body).toString()).worker).toBe(1);
      const replay = await post(w0.url, key);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.json.worker).toBe(1);
      const events = await deltaEvents(w0, before);
      expect(events['lease-lost']).toBeGreaterThanOrEqual(1);
      expect(events.complete ?? 0).toBe(0);
      // Its client got an error (what error: see the framework block below), never a success.
      expect(late.status).toBeGreaterThanOrEqual(400);
    });

    it.sequential('frozen after its effect, before its response: the downstream payment is made once (keyFor), the late completion is fenced', async () => {
      const [w0, w1] = group.workers as [Worker, Worker];
      const key = freshKey('after');
      const before = await eventsOf(w0);
      const frozen = post(w0.url, key, { 'x-freeze-at': 'after-effect' });
      await waitFrozen(w0);
      const { reply: taken } = await retryUntilSettled(w1.url, key);
      expect(taken.status).toBe(201);
      expect(taken.json.worker).toBe(1);
      thaw(w0);
      const late = await frozen;

      // The same downstream key on both runs: one payment, two calls.
      expect(payments.calls(key)).toBe(2);
      expect(payments.payments(key)).toBe(1);
      // The local effect: in transactional mode the fenced run's write rolled back; without it, the
      // one extra execution the design allows.
      expect(await backend.effects(key)).toBe(backend.transactional ? 1 : 2);
      const record = await backend.record(key);
      expect(record?.state).toBe('completed');
      if (record?.state === 'completed')
        expect(JSON.parse(Buffer.from(record.response.body).toString()).worker).toBe(1);
      const events = await settledEvents(w0, before);
      expect(events['lease-lost:fenced']).toBe(1);
      expect(events.complete ?? 0).toBe(0);
      // docs/reliability.md, scenario 4: the late finisher's client gets its own 201 (not stored), or
      // 503 in transactional mode (its transaction could not commit).
      expect(late.status).toBe(backend.transactional ? 503 : 201);
      if (late.status === 201) expect(late.json.payment).toBe(taken.json.payment);
    });

    it.sequential('frozen with its completion in flight: the store has it, retries replay it during the freeze, and the thawed process serves it without a false lease loss', async () => {
      const [w0, w1] = group.workers as [Worker, Worker];
      const key = freshKey('inflight');
      const before = await eventsOf(w0);
      const frozen = post(w0.url, key, { 'x-freeze-at': 'completion-in-flight' });
      await waitFrozen(w0);
      // Frozen past the store timeout (2 s) and two leases: every retry meanwhile is answered
      // (replay, or 409/503 while transactional mode's row is locked by the uncommitted completion).
      const started = performance.now();
      const during: number[] = [];
      while (performance.now() - started < 2_600) {
        const reply = await post(w1.url, key);
        during.push(reply.status);
        expect([200, 201, 409, 503]).toContain(reply.status);
        if (reply.status === 201) expect(reply.headers.get('idempotent-replayed')).toBe('true');
        await pause(100);
      }
      if (!backend.transactional) expect(during.every((s) => s === 201)).toBe(true);
      thaw(w0);
      const late = await frozen;
      expect(late.status).toBe(201);
      expect(late.json.worker).toBe(0);
      const after = await retryUntilSettled(w1.url, key);
      expect(after.reply.status).toBe(201);
      expect(after.reply.headers.get('idempotent-replayed')).toBe('true');
      expect(after.reply.json.execution).toBe(late.json.execution);
      expect(await backend.effects(key)).toBe(1);
      expect(payments.payments(key)).toBe(1);
      // What this process reported of it: the completion it made, stored. Was wrong: on thaw the
      // store deadlines' timer ran before the answer already in the socket was read, so the
      // completion was reported as a store error, retried, its lease reported lost, and the
      // `complete` event never came (a stored outcome counted as a failure and a lost lease).
      const events = await settledEvents(w0, before);
      expect(events.complete ?? 0).toBe(1);
      expect(events['store-error'] ?? 0).toBe(0);
      expect(events['lease-lost'] ?? 0).toBe(0);
    });

    /** Freezes worker 0 with `headers` and thaws it once the store has let its lease go (abandoned). */
    async function freezePastLease(key: string, headers: Record<string, string>): Promise<Reply> {
      const w0 = group.workers[0] as Worker;
      const frozen = post(w0.url, key, headers);
      await waitFrozen(w0);
      // Poll the store until it has let the frozen lease go, by its own clock.
      const started = performance.now();
      for (;;) {
        const record = await backend.record(key);
        if (record?.state === 'abandoned') break;
        if (performance.now() - started > 10_000) throw new Error(`the lease never ran out: ${record?.state}`);
        await pause(50);
      }
      thaw(w0);
      return frozen;
    }

    it.sequential('frozen past its lease with nobody competing, its signal unread: the heartbeat renews the abandoned claim and the outcome is stored', async () => {
      const [w0, w1] = group.workers as [Worker, Worker];
      const key = freshKey('alone');
      const before = await eventsOf(w0);
      const late = await freezePastLease(key, { 'x-freeze-at': 'before-effect', 'x-check-signal': '0' });
      expect(late.status).toBe(201);
      expect(late.json.worker).toBe(0);
      const after = await retryUntilSettled(w1.url, key);
      expect(after.reply.headers.get('idempotent-replayed')).toBe('true');
      expect(after.reply.json.execution).toBe(late.json.execution);
      expect(await backend.effects(key)).toBe(1);
      const events = await settledEvents(w0, before);
      // The signal aborted on thaw (no renewal confirmed for a whole lease: docs/concepts.md, "A
      // lease that cannot be renewed"), the heartbeat renewed the abandoned claim, and the outcome
      // was stored: not fenced, since nobody took the key over.
      expect(events['lease-lost:renew-failed']).toBe(1);
      expect(events['lease-lost:fenced'] ?? 0).toBe(0);
      expect(events.complete).toBe(1);
    });

    it.sequential('frozen past its lease with nobody competing, stopping on its signal: nothing is stored, the same request runs once on retry', async () => {
      const [w0, w1] = group.workers as [Worker, Worker];
      const key = freshKey('alone-stop');
      const before = await eventsOf(w0);
      const late = await freezePastLease(key, { 'x-freeze-at': 'before-effect' });
      expect(late.status).toBeGreaterThanOrEqual(400);
      expect(await backend.effects(key)).toBe(0);
      // Settled as a crash (docs/concepts.md, maxExecution): the key is left abandoned for this request
      // (polled: a heartbeat renewal sent before the settle may land after it and hold the key one
      // lease more, never longer).
      await abandoned(backend, key);
      const events = await deltaEvents(w0, before);
      expect(events['not-stored']).toBe(1);
      expect(events.complete ?? 0).toBe(0);
      const retry = await retryUntilSettled(w1.url, key);
      expect(retry.reply.status).toBe(201);
      expect(retry.reply.json.worker).toBe(1);
      expect(await backend.effects(key)).toBe(1);
      expect(payments.payments(key)).toBe(1);
    });
  });
}

// Fastify and Koa, on Redis: the same freeze before the effect. Worker 0 runs Fastify, worker 1 Koa,
// worker 2 Express; each frozen one's key is taken over by a worker of another framework, which
// also checks that the three adapters claim the same record for the same request.
describe.runIf(procfs && available.redis)('process freeze, each framework (redis)', { concurrent: true }, () => {
  let backend: Backend;
  let group: Workers;
  const frameworks = ['fastify', 'koa', 'express'] as const;

  beforeAll(() =>
    together(async () => {
      backend = await createBackend('redis', 'audit_freeze_fw');
      group = await startWorkers({
        count: 3,
        script: freezeWorker,
        readyTimeoutMs: 40_000,
        env: (index) => ({
          ...backend.env(),
          FRAMEWORK: frameworks[index] as string,
          LEASE_MS: String(leaseMs),
          STORE_TIMEOUT_MS: '2000',
          DOWNSTREAM_URL: payments.url,
        }),
      });
    }),
  );
  afterEach(() => {
    for (const worker of group?.workers ?? []) thaw(worker);
  });
  afterAll(async () => {
    for (const worker of group?.workers ?? []) thaw(worker);
    await group?.close();
    await backend?.close();
  });

  /** Freezes `frozenIndex` before its effect, lets `takerIndex` take over, thaws; the frozen client's reply. */
  async function freezeAndTakeOver(frozenIndex: number, takerIndex: number): Promise<Reply> {
    const frozenWorker = group.workers[frozenIndex] as Worker;
    const taker = group.workers[takerIndex] as Worker;
    const key = freshKey(`fw${frozenIndex}`);
    const frozen = post(frozenWorker.url, key, { 'x-freeze-at': 'before-effect' });
    await waitFrozen(frozenWorker);
    const { reply: taken } = await retryUntilSettled(taker.url, key);
    expect(taken.status).toBe(201);
    expect(taken.json.worker).toBe(takerIndex);
    thaw(frozenWorker);
    const late = await frozen;
    expect(await backend.effects(key)).toBe(1);
    expect(payments.calls(key)).toBe(1);
    const replay = await post(frozenWorker.url, key);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.json.worker).toBe(takerIndex);
    return late;
  }

  it.sequential.each([
    [0, 1],
    [1, 0],
  ])(
    'worker %i (fastify, koa) frozen before its effect: it stops on its signal, the takeover of worker %i runs once',
    async (frozenIndex, takerIndex) => {
      const late = await freezeAndTakeOver(frozenIndex, takerIndex);
      expect(late.status).toBeGreaterThanOrEqual(400);
    },
  );

  it.sequential.each([0, 1])(
    'worker %i (fastify, koa) frozen past its lease with nobody competing, stopping on its signal: nothing is stored, the retry runs once',
    async (index) => {
      const frozenWorker = group.workers[index] as Worker;
      const other = group.workers[2] as Worker;
      const key = freshKey(`fw-alone${index}`);
      const frozen = post(frozenWorker.url, key, { 'x-freeze-at': 'before-effect' });
      await waitFrozen(frozenWorker);
      const started = performance.now();
      while ((await backend.record(key))?.state !== 'abandoned') {
        if (performance.now() - started > 10_000) throw new Error('the lease never ran out');
        await pause(50);
      }
      thaw(frozenWorker);
      const late = await frozen;
      expect(late.status).toBeGreaterThanOrEqual(400);
      await abandoned(backend, key);
      const retry = await retryUntilSettled(other.url, key);
      expect(retry.reply.status).toBe(201);
      expect(await backend.effects(key)).toBe(1);
    },
  );

  // Was wrong: a handler that stops on its aborted signal (`signal.throwIfAborted()`, or a `fetch`
  // given the signal) threw the signal's reason, a plain `Error('lease lost')` with no code. Every
  // framework answered it as any bug: Express's default handler a 500 HTML page with the stack trace
  // (outside production), Fastify a 500 JSON with the message, Koa a 500 "Internal Server Error".
  // Decided: the signal aborts with an IdempotencyError `lease_lost` (503, retryable, Retry-After),
  // which the adapters answer as problem+json (Express through idempotencyErrors()).
  it.sequential.each(frameworks.map((name, index) => [name, index, (index + 1) % 3] as const))(
    '%s: the client of a run that stopped on its lost lease gets 503 with Retry-After and a problem body, not a 500',
    async (_name, frozenIndex, takerIndex) => {
      const late = await freezeAndTakeOver(frozenIndex, takerIndex);
      expect(late.status).toBe(503);
      expect(late.headers.get('retry-after')).not.toBeNull();
      expect(late.headers.get('content-type')).toContain('application/problem+json');
    },
  );
});
