// Review of `npm start`'s refusal of an unreachable REDIS_URL (main.ts: connectRedis, redactedUrl).
import { expect, it } from 'vitest';
import { freePort } from './ports.js';
import { startScript } from './start-script.js';

const { spawnApp } = startScript('idem-config-review-');

/** Runs start.mjs with `overrides`; resolves with its exit code and everything it printed. */
async function start(overrides: Record<string, string>): Promise<{ code: number | 'started'; output: string }> {
  const { child } = await spawnApp(process.execPath, ['examples/reference-app/start.mjs'], overrides);
  let output = '';
  return new Promise((resolve) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Ctrl-C stops everything.')) {
        process.kill(-(child.pid as number), 'SIGKILL');
        resolve({ code: 'started', output });
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('exit', (code) => resolve({ code: code ?? -1, output }));
  });
}

// Was a defect: a REDIS_URL written without its scheme (`user:password@host:port`, which ioredis accepts
// and connects to with that password) is printed with its password when the server cannot be
// reached: redactedUrl parses it with WHATWG URL as scheme `user:` with an empty password, so
// nothing is redacted ("REDIS_URL: cannot connect to user:s3cret-review@127.0.0.1:..."); expected:
// the password never printed (redact what ioredis takes as the password, or print only host:port).
it('an unreachable REDIS_URL without its scheme does not print its password', async () => {
  const run = await start({ REDIS_URL: `user:s3cret-review@127.0.0.1:${await freePort()}` });
  expect(run.code, run.output).toBe(1);
  expect(run.output).toContain('REDIS_URL');
  expect(run.output).not.toContain('s3cret-review');
}, 40_000);
