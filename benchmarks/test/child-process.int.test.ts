// A child asked for its CPU time answers, and one that is gone makes `cpu()` reject instead of
// leaving the run waiting forever.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startChild } from '../lib/child-process.mjs';

interface Child {
  message: { port: number };
  pid: number;
  cpu(): Promise<number>;
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
      expect(first).toBeGreaterThan(0);
      expect(await child.cpu()).toBeGreaterThanOrEqual(first);
    } finally {
      await child.stop();
    }
  });

  it('rejects when the child dies before it answers', async () => {
    const child = await start();
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
