// Environment audit of the embedded store (PGlite in a folder, `npm start`'s default): two handles on
// one folder, as two `npm start` on one checkout (or one DATA_DIR) make. PGlite takes no lock on its
// folder; each handle keeps its own buffers and the last to close writes its view over the other's.
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { type Database, DataDirError, openDatabase } from '../src/db.js';

const dirs: string[] = [];
const open: Database[] = [];
const locks: string[] = [];
afterEach(async () => {
  await Promise.allSettled(open.splice(0).map((db) => db.close()));
  await Promise.all(dirs.splice(0).map((dir) => rm(dir, { recursive: true, force: true })));
  await Promise.all(locks.splice(0).map((lock) => rm(lock, { force: true })));
});

async function folder(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'idem-store-folder-audit-'));
  dirs.push(dir);
  locks.push(`${dir}.lock`);
  return dir;
}

/** A second openDatabase on `dataDir`, or undefined when it is refused (what a fix should do). */
async function secondHandle(dataDir: string): Promise<Database | undefined> {
  try {
    return await openDatabase({ dataDir });
  } catch {
    return undefined;
  }
}

describe('the embedded store folder, opened twice', () => {
  // Was a defect: openPglite (examples/reference-app/src/db.ts) opens a folder another process (or handle)
  // has open without a word: a second `npm start` on the same checkout or DATA_DIR runs on it as if it
  // were its own. Fix: take an exclusive lock on the folder (a lock file created with 'wx' holding the
  // pid, checked for a live process) and refuse with a ConfigError naming DATA_DIR.
  it('a second handle on a folder in use is refused', async () => {
    const dir = await folder();
    const first = await openDatabase({ dataDir: dir });
    open.push(first);
    const second = await secondHandle(dir);
    if (second) open.push(second);
    expect(second).toBeUndefined();
  });

  // Was a defect: with two handles on one folder, rows the first committed are gone once the second
  // closes after it: a charge answered 201 and its Idempotency-Key record vanish, so the client's
  // retry charges again (seen end to end with two `npm start` on one DATA_DIR). Same fix as above;
  // once the second handle is refused, this passes.
  it('rows the first handle committed survive a second handle on the same folder', async () => {
    const dir = await folder();
    const first = await openDatabase({ dataDir: dir });
    await first.exec('create table audit_rows (n int)');
    await first.query('insert into audit_rows values (1)');
    const second = await secondHandle(dir);
    await first.query('insert into audit_rows values (2)');
    await second?.query('insert into audit_rows values (3)').catch(() => undefined);
    await first.close();
    await second?.close();
    const after = await openDatabase({ dataDir: dir });
    open.push(after);
    const { rows } = await after.query<{ n: number }>('select n from audit_rows order by n');
    expect(rows.map((row) => row.n)).toEqual(expect.arrayContaining([1, 2]));
  });
});

describe('the embedded store folder after a process that held it was killed', () => {
  it('takes over a lock whose process is gone', async () => {
    const dir = await folder();
    // A pid that surely names no process any more: one of a child that has exited.
    const child = spawn(process.execPath, ['-e', '0']);
    const pid = child.pid as number;
    await new Promise((resolve) => child.once('exit', resolve));
    await writeFile(`${dir}.lock`, String(pid));
    const db = await openDatabase({ dataDir: dir });
    open.push(db);
    expect(await readFile(`${dir}.lock`, 'utf8')).toBe(String(process.pid));
    await db.close();
    open.pop();
    await expect(readFile(`${dir}.lock`, 'utf8')).rejects.toThrow(/ENOENT/);
  });
});

describe('an embedded store folder PGlite cannot start on', () => {
  // Was a defect (found by running the app on PGlite 0.5): only PGlite 0.3's ExitStatus was told
  // apart; any other failed start (0.5's ErrnoError, "failed to initialize properly") was a raw error.
  it('is a DataDirError naming the folder, whatever PGlite threw', async () => {
    const dir = await folder();
    // What a folder made by another PostgreSQL major looks like to this PGlite.
    await writeFile(join(dir, 'PG_VERSION'), '9\n');
    const failure = await openDatabase({ dataDir: dir }).then(
      (db) => {
        open.push(db);
        return undefined;
      },
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(DataDirError);
    expect((failure as Error).message).toContain(dir);
    // The lock is given back: the next start is not refused as "in use".
    await expect(readFile(`${dir}.lock`, 'utf8')).rejects.toThrow(/ENOENT/);
  });
});
