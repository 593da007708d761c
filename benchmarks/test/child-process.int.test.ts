// A child asked for its CPU time answers, and one that is gone makes `cpu()` reject instead of
// leaving the run waiting forever.
import { spawn } from 'node:child_process';
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

// A server child whose cleanup hangs (its store's server already gone) must still end on a signal.
describe('onStop', () => {
  const script = (graceMs: number) => `
    import { onStop } from ${JSON.stringify(new URL('../lib/child-process.mjs', import.meta.url).href)};
    onStop(() => new Promise(() => {}), { graceMs: ${graceMs} });
    setInterval(() => {}, 1000);
    console.log('ready');
  `;

  // Starts the script, waits for it to be ready, sends `signals` one after the other, and resolves
  // with its exit code and how long it took to exit after the first signal.
  async function interrupt(graceMs: number, signals: NodeJS.Signals[]) {
    const child = spawn(process.execPath, ['--input-type=module', '-e', script(graceMs)], { stdio: 'pipe' });
    await new Promise((resolve) => child.stdout.once('data', resolve));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    const sentAt = Date.now();
    for (const signal of signals) child.kill(signal);
    const code = await exited;
    return { code, ms: Date.now() - sentAt };
  }

  it('exits at once on a second signal while its cleanup hangs', async () => {
    // Two different signals: two of the same kind sent together may reach the process as one.
    const { code, ms } = await interrupt(60_000, ['SIGTERM', 'SIGINT']);
    // The code of whichever signal the process handled second.
    expect([130, 143]).toContain(code);
    expect(ms).toBeLessThan(30_000);
  });

  it('exits after its grace period when the cleanup hangs and no second signal comes', async () => {
    const { code } = await interrupt(100, ['SIGINT']);
    expect(code).toBe(130);
  });
});
