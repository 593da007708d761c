// The root README's first screen, run as a newcomer runs it: its Quick start block saved as a file
// and run (imported by the test, so the packages resolve from this checkout's sources, as in every
// test: a clean clone has no built dist for a separate tsx process to load), then its curl line sent
// twice. The block is type-checked by code-blocks.test.ts; this checks that what the README says it
// does, it does. The one change: `app.listen(3000)` listens on a free port and is exported, so the
// test can close it.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const code = /^## Quick start\n+```ts\n([\s\S]*?)^```/m.exec(readme)?.[1];
const curl = /^`(curl -X POST localhost:3000\/charges [^`]+)`\ntwice/m.exec(readme)?.[1];

const folder = mkdtempSync(join(tmpdir(), 'idem-readme-quick-start-'));
let server: Server | undefined;
afterAll(async () => {
  if (server !== undefined) {
    server.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
  }
  rmSync(folder, { recursive: true, force: true });
});

describe("the root README's Quick start", () => {
  it('its curl line sent twice gives one 201 and its replay, byte for byte; a POST without a key is 400', async () => {
    expect(code, 'README.md has no ts block under "## Quick start"').toBeDefined();
    expect(curl, 'README.md has no curl line followed by "twice"').toBeDefined();
    expect(code).toContain('app.listen(3000);');
    const file = join(folder, 'server.ts');
    writeFileSync(file, (code as string).replace('app.listen(3000);', 'export const server = app.listen(0);'));
    server = ((await import(file)) as { server: Server }).server;
    if (!server.listening) await new Promise((resolve) => server?.once('listening', resolve));
    const { port } = server.address() as AddressInfo;
    // `-i` shows the head; the README's line prints the body only.
    const command = `${(curl as string).replace('localhost:3000', `127.0.0.1:${port}`)} -s -i`;
    const send = async (): Promise<string> =>
      (await promisify(execFile)('bash', ['-c', command], { encoding: 'utf8' })).stdout;
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
