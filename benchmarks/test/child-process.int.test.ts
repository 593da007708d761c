// A child asked for its CPU time answers, and one that is gone makes `cpu()` reject instead of
// leaving the run waiting forever.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startChild } from '../lib/child-process.mjs';

interface Child {
  message: { port: number };
  pid: number;
  cpu(): Promise<{ cpuMicros: number; systemMicros: number }>;
  stop(): Promise<void>;
}

const start = (): Promise<Child> => startChild('serve.mjs', { kind: 'node-http' });

describe('startChild cpu()', () => {
  it('resolves with the CPU time the child used so far', async () => {
    const child = await start();
    try {
      const first = await child.cpu();
      const response = await fetch(`http://127.0.0.1:${child.message.port}/charges`, { method: 'POST', body: '{}' });
      await response.arrayBuffer();
      expect(first.cpuMicros).toBeGreaterThan(0);
      expect(first.systemMicros).toBeGreaterThanOrEqual(0);
      expect(first.systemMicros).toBeLessThanOrEqual(first.cpuMicros);
      expect((await child.cpu()).cpuMicros).toBeGreaterThanOrEqual(first.cpuMicros);
    } finally {
      await child.stop();
    }
  });

  it('rejects when the child dies before it answers', async () => {
    const child = await start();
    // Stopped first, so it cannot answer before it dies.
    process.kill(child.pid, 'SIGSTOP');
    const asked = child.cpu();
    process.kill(child.pid, 'SIGKILL');
    await expect(asked).rejects.toThrow(/serve\.mjs/);
    await child.stop();
  });

  it('rejects at once when the child has already exited', async () => {
    const child = await start();
    await child.stop();
    await expect(child.cpu()).rejects.toThrow('serve.mjs exited before it reported its CPU time');
  });
});
