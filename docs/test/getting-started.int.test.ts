// Follows docs/getting-started.md word for word, the way a newcomer would, and checks that the page's
// idempotent route really works: first POST 201, the retry replays with `Idempotent-Replayed: true`,
// the same key with another body is 422, and behind the guard a key never crosses from one caller to
// another.
//
// How the page is read, in order:
//   ```sh            every line runs in one bash session in a scratch folder (so `cd` and variables
//                    carry over, as in a terminal); `localhost:3000` becomes the test's free port
//   ```sh server     the command starts the server the next commands talk to (a second terminal)
//   ```ts title="x"  the file `x` is written into the project folder
//   ```text          output shown to the reader; not run
// The one substitution is the one the page itself gives while idem is not on the registry: every
// `@idem/*` name in an `npm install` line becomes the tarball `npm pack` made of this checkout (with
// the tarballs of the @idem packages it depends on); everything else is installed by npm (from its
// cache when it has it). So what runs is what a user installs: the packed dist, its manifest's
// exports and dependencies, and its type declarations, which a last test type-checks the page's
// TypeScript files against.
// Sections that need Redis or PostgreSQL are skipped loudly when the service is unreachable, and
// fail with CI=true.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from './free-port.js';
import { type PackedPackages, packPackages } from './packed-packages.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'getting-started.md'), 'utf8');
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

type Step =
  | { kind: 'shell'; lines: string[] }
  | { kind: 'server'; command: string }
  | { kind: 'file'; name: string; code: string };

interface Section {
  title: string;
  steps: Step[];
}

// The page's sections (## and ### headings) with their runnable blocks, in order.
function readPage(text: string): Section[] {
  const sections: Section[] = [];
  const token = /^(#{2,3}) (.+)$|^```([\w-]*)([^\n]*)\n([\s\S]*?)^```\s*$/gm;
  for (let match = token.exec(text); match; match = token.exec(text)) {
    if (match[1] !== undefined) {
      sections.push({ title: (match[2] ?? '').trim(), steps: [] });
      continue;
    }
    const lang = match[3] ?? '';
    const info = (match[4] ?? '').trim();
    const code = match[5] ?? '';
    const section = sections.at(-1);
    if (section === undefined) continue;
    if (lang === 'sh' && info === 'server') section.steps.push({ kind: 'server', command: code.trim() });
    else if (lang === 'sh') {
      const lines = code.split('\n').filter((line) => line.trim() !== '' && !line.trim().startsWith('#'));
      section.steps.push({ kind: 'shell', lines });
    } else if (lang === 'ts') {
      const name = /title="([^"]+)"/.exec(info)?.[1];
      if (name !== undefined) section.steps.push({ kind: 'file', name, code });
    }
  }
  return sections;
}

const sections = readPage(page);
const section = (title: string): Section => {
  const found = sections.find((s) => s.title === title);
  if (found === undefined) throw new Error(`docs/getting-started.md has no section "${title}"`);
  return found;
};

// One bash session, like the reader's second terminal.
interface Shell {
  run(command: string): Promise<{ output: string; status: number }>;
  close(): void;
}

function openShell(cwd: string, env: NodeJS.ProcessEnv): Shell {
  const bash = spawn('bash', ['--noprofile', '--norc'], { cwd, env, stdio: ['pipe', 'pipe', 'pipe'] });
  let buffer = '';
  let waiting: ((chunk: string) => void) | undefined;
  const onData = (chunk: Buffer) => {
    buffer += chunk.toString('utf8');
    waiting?.(buffer);
  };
  bash.stdout.on('data', onData);
  bash.stderr.on('data', onData);
  let counter = 0;
  return {
    run(command) {
      counter += 1;
      const marker = `__idem_done_${counter}__`;
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timed out: ${command}\n${buffer}`)), 60_000);
        waiting = (text) => {
          const at = text.search(new RegExp(`\\n${marker}(\\d+)\\n`));
          if (at === -1) return;
          const status = Number(new RegExp(`\\n${marker}(\\d+)\\n`).exec(text)?.[1]);
          clearTimeout(timer);
          waiting = undefined;
          buffer = '';
          resolve({ output: text.slice(0, at), status });
        };
        bash.stdin.write(`{ ${command}\n} 2>&1; printf '\\n${marker}%s\\n' $?\n`);
      });
    },
    close() {
      bash.stdin.end();
      bash.kill();
    },
  };
}

interface Reply {
  status: number;
  headers: Record<string, string>;
  body: string;
}

function parseCurl(output: string): Reply {
  const start = output.indexOf('HTTP/');
  expect(start, `curl printed no response:\n${output}`).toBeGreaterThanOrEqual(0);
  const text = output.slice(start);
  const split = text.indexOf('\r\n\r\n');
  const head = text.slice(0, split).split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of head.slice(1)) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  return { status: Number(head[0]?.split(' ')[1]), headers, body: text.slice(split + 4) };
}

const skipped = 'the getting-started sections that need it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);

const scratch = mkdtempSync(join(tmpdir(), 'idem-getting-started-'));
const env: NodeJS.ProcessEnv = {
  ...process.env,
  PATH: `${join(root, 'node_modules', '.bin')}:${process.env.PATH ?? ''}`,
  REDIS_URL: redisUrl,
  DATABASE_URL: databaseUrl,
  npm_config_update_notifier: 'false',
  npm_config_fund: 'false',
  npm_config_audit: 'false',
};
let shell: Shell;
let project = scratch;
let port = 0;
let server: ChildProcess | undefined;

async function stopServer(): Promise<void> {
  const running = server;
  server = undefined;
  if (running?.pid === undefined || running.exitCode !== null) return;
  const exited = new Promise((resolve) => running.once('exit', resolve));
  // npx, tsx and node form a process group of their own: end all of it.
  process.kill(-running.pid, 'SIGTERM');
  await exited;
}

async function startServer(command: string): Promise<void> {
  await stopServer();
  port = await freePort();
  const child = spawn('bash', ['-c', `exec ${command}`], {
    cwd: project,
    env: { ...env, PORT: String(port) },
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  server = child;
  let log = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not start:\n${log}`)), 45_000);
    const onData = (chunk: Buffer) => {
      log += chunk.toString('utf8');
      if (log.includes(`listening on http://localhost:${port}`)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited with ${code}:\n${log}`));
    });
  });
}

// The @idem packages the page installs, packed from this checkout once for the whole page.
const packedNames = ['core', 'guard', 'express', 'redis', 'postgres'];
let packed: PackedPackages | undefined;

// An @idem package's tarball and those of the @idem packages it depends on (none is on the registry).
function tarballsFor(name: string): string[] {
  const tarball = packed?.tarballs.get(name);
  expect(tarball, `${name} is packed for the page (add its folder to packedNames)`).toBeDefined();
  const manifest = JSON.parse(
    readFileSync(join(root, 'packages', name.slice('@idem/'.length), 'package.json'), 'utf8'),
  );
  const siblings = Object.keys(manifest.dependencies ?? {}).filter((dependency) => dependency.startsWith('@idem/'));
  return [tarball as string, ...siblings.flatMap(tarballsFor)];
}

// `npm install a @idem/b --save-dev c`, with each @idem name replaced by its tarballs.
function installCommand(line: string): string {
  const words = line.split(/\s+/);
  const installed = words.flatMap((word) => (word.startsWith('@idem/') ? tarballsFor(word) : [word]));
  return [...new Set(installed), '--prefer-offline', '--no-audit', '--no-fund'].join(' ');
}

// The TypeScript files of the sections followed so far, in order (a later server.ts replaces the
// file, not the need for the earlier one to type-check).
const written: string[] = [];

// Runs a section's steps; returns every curl reply, in order.
async function follow(title: string): Promise<Reply[]> {
  const replies: Reply[] = [];
  const { steps } = section(title);
  expect(steps.length, `section "${title}" has steps`).toBeGreaterThan(0);
  for (const step of steps) {
    if (step.kind === 'file') {
      writeFileSync(join(project, step.name), step.code);
      written.push(step.code);
    } else if (step.kind === 'server') {
      await startServer(step.command);
    } else {
      for (const line of step.lines) {
        const command = /^npm (install|i)\b/.test(line)
          ? installCommand(line)
          : line.replaceAll('localhost:3000', `localhost:${port}`);
        const { output, status } = await shell.run(command);
        expect(status, `"${line}" exited with ${status}:\n${output}`).toBe(0);
        if (line.startsWith('curl ')) replies.push(parseCurl(output));
        if (/\bcd\b/.test(line)) project = (await shell.run('pwd')).output.trim();
      }
    }
  }
  return replies;
}

// The three answers of steps 2 and 3: created, replayed byte for byte, refused for another body.
function expectCreatedReplayedRefused(replies: Reply[]): void {
  expect(replies.map((r) => r.status)).toEqual([201, 201, 422]);
  const [first, retry, other] = replies as [Reply, Reply, Reply];
  expect(JSON.parse(first.body)).toMatchObject({ item: 'book', id: expect.any(String) });
  expect(first.headers['idempotent-replayed']).toBeUndefined();
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(retry.body).toBe(first.body);
  expect(other.headers['content-type']).toContain('application/problem+json');
  expect(JSON.parse(other.body)).toMatchObject({ code: 'fingerprint_mismatch', status: 422 });
}

beforeAll(async () => {
  shell = openShell(scratch, env);
  packed = await packPackages(root, packedNames, env);
}, 240_000);

afterAll(async () => {
  await stopServer();
  shell?.close();
  packed?.remove();
  rmSync(scratch, { recursive: true, force: true });
});

describe('docs/getting-started.md, followed word for word', () => {
  it('1. sets up a project', async () => {
    await follow('1. A project');
    expect(project).toBe(join(scratch, 'shop'));
    expect(JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')).type).toBe('module');
  });

  it('2. the memory-store route: 201, then the replay, then 422 for another body', async () => {
    expectCreatedReplayedRefused(await follow('2. An idempotent route, in memory'));
  });

  it.runIf(withRedis)('3A. the same over Redis', async () => {
    expectCreatedReplayedRefused(await follow('Option A: Redis'));
  });

  it.runIf(withPostgres)('3B. the same over PostgreSQL', async () => {
    expectCreatedReplayedRefused(await follow('Option B: PostgreSQL'));
  });

  it('4. behind the guard: 401 without a token, keys scoped by caller, 422 for another body', async () => {
    const replies = await follow('4. The guard in front');
    expect(replies.map((r) => r.status)).toEqual([401, 201, 201, 201, 422]);
    const [anonymous, alice, aliceRetry, bob, aliceOther] = replies as [Reply, Reply, Reply, Reply, Reply];
    expect(anonymous.headers['www-authenticate']).toMatch(/^Bearer realm=/);
    expect(JSON.parse(alice.body)).toMatchObject({ owner: 'alice', item: 'book' });
    expect(aliceRetry.headers['idempotent-replayed']).toBe('true');
    expect(aliceRetry.body).toBe(alice.body);
    expect(bob.headers['idempotent-replayed']).toBeUndefined();
    expect(JSON.parse(bob.body)).toMatchObject({ owner: 'bob' });
    expect(JSON.parse(bob.body).id).not.toBe(JSON.parse(alice.body).id);
    expect(JSON.parse(aliceOther.body)).toMatchObject({ code: 'fingerprint_mismatch' });
  });

  // tsx only strips types, so the steps above would pass with declarations that do not match the
  // code, or that name a module the tarball lacks. Every file of the page is type-checked, strictly
  // and without skipping declaration files, against what the tarballs and npm installed.
  it('5. every TypeScript file of the page type-checks against the installed packages', async () => {
    expect(written.length).toBeGreaterThanOrEqual(3);
    const folder = join(project, 'typecheck');
    mkdirSync(folder, { recursive: true });
    const files = written.map((code, index) => {
      const name = join(folder, `file${index}.ts`);
      writeFileSync(name, code);
      return name;
    });
    const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
    const flags = '--noEmit --strict --module nodenext --moduleResolution nodenext --target es2023 --types node';
    const { output, status } = await shell.run(`node ${tsc} ${flags} ${files.join(' ')}`);
    // Errors inside a third party's own declarations are that package's to fix and would stop this
    // check on the day a dependency publishes one (ioredis 6.1.0's import an untyped `redis-errors`).
    // Errors in the page's files and in @idem's declarations always count.
    const located = output.split('\n').filter((line) => /^\S+\(\d+,\d+\): error /.test(line));
    const ours = located.filter((line) => !line.startsWith('node_modules/') || line.startsWith('node_modules/@idem/'));
    expect(status === 0 || (located.length > 0 && ours.length === 0), output).toBe(true);
  });
});
