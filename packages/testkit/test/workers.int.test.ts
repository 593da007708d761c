import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { startWorkers } from '../src/workers.js';

const script = fileURLToPath(new URL('./fixtures/echo-worker.ts', import.meta.url));

describe('startWorkers', () => {
  it('starts N real processes, kills one at a chosen point with SIGKILL, and restarts it', async () => {
    const group = await startWorkers({ count: 3, script, env: (i) => ({ KILL_AT: i === 1 ? 'inside-handler' : '' }) });
    try {
      const answers = await Promise.all(group.workers.map((w) => fetch(w.url).then((r) => r.text())));
      expect(answers).toEqual(['worker 0', 'worker 1', 'worker 2']);
      const pids = new Set(group.workers.map((w) => w.process.pid));
      expect(pids.size).toBe(3);

      // Worker 1 dies inside its handler: the client sees the connection drop, the process a SIGKILL.
      await expect(fetch(`${group.workers[1]!.url}/die`)).rejects.toThrow();
      expect(await group.workers[1]!.exited).toBe('SIGKILL');

      const again = await group.restart(1);
      expect(await fetch(again.url).then((r) => r.text())).toBe('worker 1');
      // The others never noticed.
      expect(await fetch(`${group.workers[0]!.url}/die`).then((r) => r.text())).toBe('worker 0');
    } finally {
      await group.close();
    }
    for (const worker of group.workers)
      expect(worker.process.exitCode !== null || worker.process.signalCode !== null).toBe(true);
  });

  it('reports a worker that never becomes ready, with its output', async () => {
    const broken = fileURLToPath(new URL('./fixtures/does-not-exist.ts', import.meta.url));
    await expect(startWorkers({ count: 1, script: broken, readyTimeoutMs: 10_000 })).rejects.toThrow(/exited/);
  });
});
