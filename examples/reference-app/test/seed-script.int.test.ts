// `npm run seed` reads its environment as `npm start` does: a mistake is one line naming the
// variable (no stack), and the app's callback is registered where the app then sends the browser.
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db.js';
import { findClient } from '../src/idp/clients.js';
import { appClientId } from '../src/seed.js';
import { runScript } from './start-script.js';

const scratch = await mkdtemp(join(tmpdir(), 'idem-seed-script-'));
afterAll(() => rm(scratch, { recursive: true, force: true }));

// As `npm run seed` runs: APP_URL and APP_PORT as this test gives them, or unset.
const seedWith = (env: Record<string, string>) =>
  runScript('src/seed.ts', [], { APP_URL: undefined, APP_PORT: undefined, ...env });

function expectOneLine(run: { code: number | null; output: string }, variable: string) {
  expect(run.code, run.output).toBe(1);
  const lines = run.output.trim().split('\n');
  expect(lines, run.output).toHaveLength(1);
  expect(lines[0]).toContain(variable);
}

describe('npm run seed', () => {
  // Was a defect: the seed printed a whole error object, a stack of a dozen lines, where `npm start`
  // says "DATA_DIR: ..." in one line.
  it('a DATA_DIR that is a file is one line naming the variable', async () => {
    const file = join(scratch, 'a-file');
    await writeFile(file, 'not a folder');
    expectOneLine(await seedWith({ DATA_DIR: file }), 'DATA_DIR');
  }, 60_000);

  // Was a defect: APP_PORT and APP_URL were read unchecked (APP_PORT=abc registered
  // http://localhost:abc/callback), where `npm start` refuses them.
  it('a bad APP_PORT or APP_URL is one line naming the variable, and nothing is written', async () => {
    const dir = join(scratch, 'unwritten');
    expectOneLine(await seedWith({ DATA_DIR: dir, APP_PORT: 'abc' }), 'APP_PORT');
    expectOneLine(await seedWith({ DATA_DIR: dir, APP_URL: 'localhost:9000' }), 'APP_URL');
    expect(existsSync(dir)).toBe(false);
  }, 60_000);

  // Was a defect: the seed wrote `${APP_URL}/callback`, so APP_URL=http://localhost:9000/ registered
  // http://localhost:9000//callback while the app sends http://localhost:9000/callback: every
  // sign-in was refused as a redirect_uri mismatch until the next `npm start` re-registered it.
  it('registers the callback the app sends, however APP_URL ends', async () => {
    const dir = join(scratch, 'seeded');
    const run = await seedWith({ DATA_DIR: dir, APP_URL: 'http://localhost:9000/' });
    expect(run.code, run.output).toBe(0);
    const db = await openDatabase({ dataDir: dir });
    try {
      expect((await findClient(db, appClientId))?.redirect_uris).toEqual(['http://localhost:9000/callback']);
    } finally {
      await db.close();
    }
  }, 60_000);
});
