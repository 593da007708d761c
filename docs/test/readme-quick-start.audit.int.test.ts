// The root README's first screen, run as a newcomer runs it: its Quick start block saved as a file
// and started with tsx (the packages resolved from this checkout), then its curl line sent twice.
// The block is type-checked by code-blocks.test.ts; this checks that what the README says it does,
// it does. The one change: port 3000 becomes a free port.
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from './free-port.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const code = /^## Quick start\n+```ts\n([\s\S]*?)^```/m.exec(readme)?.[1];
const curl = /^`(curl -X POST localhost:3000\/charges [^`]+)`\ntwice/m.exec(readme)?.[1];

let server: ChildProcess | undefined;
afterAll(async () => {
  if (server?.pid === undefined || server.exitCode !== null) return;
  const exited = new Promise((resolve) => server?.once('exit', resolve));
  server.kill('SIGTERM');
  await exited;
});

describe("the root README's Quick start", () => {
  it('HELD: its curl line sent twice gives one 201 and its replay, byte for byte; a POST without a key is 400', async () => {
    expect(code, 'README.md has no ts block under "## Quick start"').toBeDefined();
    expect(curl, 'README.md has no curl line followed by "twice"').toBeDefined();
    const port = await freePort();
    const folder = join(root, 'node_modules', '.cache', 'idem-readme-quick-start');
    mkdirSync(folder, { recursive: true });
    const file = join(folder, 'server.ts');
    writeFileSync(file, (code as string).replace('app.listen(3000)', `app.listen(${port})`));
    server = spawn(join(root, 'node_modules', '.bin', 'tsx'), [file], { cwd: folder, stdio: 'ignore' });
    const command = (curl as string).replace('localhost:3000', `127.0.0.1:${port}`);
    const send = async (): Promise<string> => {
      // `-i` shows the head; the README's line prints the body only.
      const args = ['-c', `${command} -s -i`];
      for (let tries = 0; ; tries++) {
        try {
          return (await promisify(execFile)('bash', args, { encoding: 'utf8' })).stdout;
        } catch (error) {
          if (tries > 300 || server?.exitCode !== null) throw error;
          await new Promise((resolve) => setTimeout(resolve, 100)); // the server is still starting
        }
      }
    };
    const split = (answer: string) => {
      const at = answer.indexOf('\r\n\r\n');
      return { head: answer.slice(0, at).toLowerCase(), body: answer.slice(at + 4) };
    };
    const first = split(await send());
    const second = split(await send());
    expect(first.head).toMatch(/^http\/1\.1 201/);
    expect(second.head).toMatch(/^http\/1\.1 201/);
    expect(first.head).not.toMatch(/idempotent-replayed/);
    expect(second.head).toMatch(/\r\nidempotent-replayed: true(\r\n|$)/);
    expect(second.body).toBe(first.body);
    expect(JSON.parse(first.body)).toMatchObject({ amount: 100 });
    // "Every POST and PATCH now needs an Idempotency-Key": without it, 400 key_missing.
    const keyless = await fetch(`http://127.0.0.1:${port}/charges`, { method: 'POST' });
    expect(keyless.status).toBe(400);
    expect(await keyless.json()).toMatchObject({ code: 'key_missing' });
  }, 60_000);
});
