// Scenarios 1, 2 and 6 again, over a real 3-master Redis Cluster (issue 10: "and Redis Cluster where
// it applies"). One cluster and one pair of workers serve the whole file, started once, so the
// bounded suite pays for the cluster's start a single time.
//
// - SIGKILL at the three points: refused (409) while the dead worker's lease lives, run again once it
//   ends, never wedged; effects 1, 2 (the write before the kill: no transactions on Redis), 1.
// - Response lost after completion: the retry gets the stored answer byte for byte; one effect.
// - Hot key at ~1,000 requests per second: one execution, at most one store operation per request.
//
// The store cut and the slow store are not repeated here: they need a TCP proxy in front of the
// store, and a proxy in front of a cluster would hide its MOVED redirections and node addresses
// (they would point past the proxy), so that fault cannot be injected faithfully per node.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type LocalRedisCluster, startRedisCluster } from '../../../redis/test/cluster.js';
import { createTcpProxy, type TcpProxy } from '../../src/tcp-proxy.js';
import type { Workers } from '../../src/workers.js';
import {
  type Answer,
  type Backend,
  chaos,
  charge,
  createClusterBackend,
  figures,
  pause,
  redisClusterAvailable,
  retryUntilSettled,
  startChargeWorkers,
  stats,
} from './support.js';

const leaseMs = 500;
const hotKeyMs = chaos ? 10_000 : 2000;
const perSecond = 1000;
const available = await redisClusterAvailable();

const totalOps = (ops: Record<string, number>) => Object.values(ops).reduce((a, b) => a + b, 0);
const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;

describe.runIf(available)('over a real 3-master Redis Cluster', () => {
  let cluster: LocalRedisCluster;
  let backend: Backend;
  let group: Workers;

  beforeAll(async () => {
    cluster = await startRedisCluster();
    backend = await createClusterBackend(cluster.nodes, 'cluster');
    // A 200 ms handler, so the hot key has a run to pile up on; the lease is renewed while it runs.
    group = await startChargeWorkers(backend, 2, {
      LEASE_MS: String(leaseMs),
      HANDLER_MS: '200',
      STORE_TIMEOUT_MS: '2000',
    });
  }, 90_000);

  afterAll(async () => {
    await group?.close();
    await backend?.close();
    await cluster?.stop();
  });

  const killPoints = [
    { killAt: 'inside-handler', effects: 1, replayAtOnce: false },
    // The write before the kill is the one extra execution Redis allows (no transaction to undo it).
    { killAt: 'after-write', effects: 2, replayAtOnce: false },
    { killAt: 'after-complete', effects: 1, replayAtOnce: true },
  ] as const;

  for (const point of killPoints) {
    it(`SIGKILL ${point.killAt}: never wedged, the retry settles within a lease, ${point.effects} effect(s)`, async () => {
      // Whatever happens below, the next test gets a live worker 0 (a failure here must not cascade).
      onTestFinished(async () => {
        if (group.workers[0]!.process.exitCode === null && group.workers[0]!.process.signalCode === null) return;
        await group.restart(0);
      });
      const key = randomUUID();
      const first = await charge(group.workers[0]!.url, key, { killAt: point.killAt });
      expect(first.status).toBe(0);
      expect(await group.workers[0]!.exited).toBe('SIGKILL');

      const immediate = await charge(group.workers[1]!.url, key);
      if (point.replayAtOnce) {
        expect(immediate.status).toBe(201);
        expect(immediate.headers.get('idempotent-replayed')).toBe('true');
      } else {
        expect(immediate.status).toBe(409);
        expect(immediate.headers.get('retry-after')).toMatch(/^\d+$/);
      }

      const settled = await retryUntilSettled(group.workers[1]!.url, key, 10 * leaseMs);
      expect(settled.answer.status).toBe(201);
      expect(settled.waitedMs).toBeLessThan(8 * leaseMs);
      const final = await charge(group.workers[1]!.url, key);
      expect(final.headers.get('idempotent-replayed')).toBe('true');
      expect(final.body).toBe(settled.answer.body);
      expect((await backend.record(key))?.state).toBe('completed');
      const effects = await backend.effects(key);
      expect(effects).toBe(point.effects);
      figures(`crash redis-cluster ${point.killAt}`, {
        recoveredAfterMs: Math.round(settled.waitedMs),
        conflictsWhileLeased: settled.conflicts,
        effects,
      });
    });
  }

  describe('response lost after completion', () => {
    let proxy: TcpProxy;

    // Runs after the crash tests (vitest runs a nested block's hooks when it is reached), so the
    // proxy points at the worker 0 they restarted.
    beforeAll(async () => {
      const url = new URL(group.workers[0]!.url);
      proxy = await createTcpProxy({ target: { host: url.hostname, port: Number(url.port) } });
    });

    afterAll(async () => {
      await proxy?.close();
    });

    it('the retry gets the replay of the lost answer; one effect', async () => {
      const rounds = 2;
      let replays = 0;
      for (let round = 0; round < rounds; round++) {
        const key = randomUUID();
        proxy.blackhole('downstream');
        const lost = await charge(`http://127.0.0.1:${proxy.port}`, key, { timeoutMs: 1500 });
        expect(lost.status).toBe(0);
        const deadline = Date.now() + 5000;
        while ((await backend.record(key))?.state !== 'completed' && Date.now() < deadline) await pause(25);
        expect((await backend.record(key))?.state).toBe('completed');

        proxy.restore();
        const again = await charge(`http://127.0.0.1:${proxy.port}`, key);
        const elsewhere = await charge(group.workers[1]!.url, key);
        for (const answer of [again, elsewhere]) {
          expect(answer.status).toBe(201);
          expect(answer.headers.get('idempotent-replayed')).toBe('true');
          expect(answer.body).toBe(again.body);
          replays++;
        }
        expect(JSON.parse(again.body)).toMatchObject({ key, worker: 0 });
        expect(await backend.effects(key)).toBe(1);
      }
      figures('response-lost redis-cluster', { requests: rounds, answersLost: rounds, replays, effectsPerKey: 1 });
    });
  });

  it(`hot key: ~${perSecond} req/s on one key for ${hotKeyMs} ms, one execution, bounded store operations`, async () => {
    const key = randomUUID();
    const before = await Promise.all(group.workers.map((w) => stats(w.url)));
    const commandsBefore = await backend.commandCount();
    const pending: Promise<Answer>[] = [];
    const start = performance.now();
    let sent = 0;
    while (performance.now() - start < hotKeyMs) {
      const due = Math.floor(((performance.now() - start) / 1000) * perSecond);
      for (; sent < due; sent++) pending.push(charge(group.workers[sent % 2]!.url, key));
      await pause(10);
    }
    const answers = await Promise.all(pending);
    const elapsed = performance.now() - start;
    const after = await Promise.all(group.workers.map((w) => stats(w.url)));
    const commands = (await backend.commandCount()) - commandsBefore;

    const statuses = new Map<number, number>();
    for (const answer of answers) statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
    const executed = answers.filter((a) => a.status === 201 && a.headers.get('idempotent-replayed') !== 'true');
    const replays = answers.filter((a) => a.headers.get('idempotent-replayed') === 'true');
    const ops = after.map((s, i) => totalOps(s.ops) - totalOps(before[i]!.ops)).reduce((a, b) => a + b, 0);
    const latencies = answers.map((a) => a.ms).sort((a, b) => a - b);
    const p99 = percentile(latencies, 0.99);
    const effects = await backend.effects(key);
    figures('hot-key redis-cluster', {
      durationMs: Math.round(elapsed),
      requests: answers.length,
      ratePerSecond: Math.round((answers.length / elapsed) * 1000),
      statuses: Object.fromEntries(statuses),
      replays: replays.length,
      executions: executed.length,
      effects,
      storeOps: ops,
      clusterCommands: commands,
      p50Ms: Math.round(percentile(latencies, 0.5)),
      p99Ms: Math.round(p99),
    });

    expect([...statuses.keys()].filter((status) => status !== 201 && status !== 409 && status !== 503)).toEqual([]);
    expect(statuses.get(503) ?? 0).toBeLessThan(answers.length / 4);
    for (const refused of answers.filter((a) => a.status === 409 || a.status === 503))
      expect(refused.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(executed).toHaveLength(1);
    for (const replay of replays) expect(replay.body).toBe(executed[0]!.body);
    expect(effects).toBe(1);
    expect((await charge(group.workers[0]!.url, key)).headers.get('idempotent-replayed')).toBe('true');
    // One store operation per request at most (the claim answers a replay or a 409 too), plus the
    // winner's completion and a few lease renewals.
    expect(ops).toBeLessThanOrEqual(answers.length + 20);
    expect(p99).toBeLessThan(4000);
  });
});
