// `npm start`'s script as a child process on PostgreSQL, for the crash audits: started again and
// again on one schema and the same ports, killed with SIGKILL (no handler runs, nothing closes), as a
// crash or an OOM kill would.
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';
import { restartablePorts } from './ports.js';
import { portVariables } from './start-script.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

/**
 * The idempotency lease of the killed apps (IDEMPOTENCY_LEASE_SECONDS), in seconds: how long a key a
 * killed process held stays locked. The audits wait such keys out for real (the store's clock ends
 * the lease, nothing is moved into the past); at the default 10 s those waits were a third of their
 * time. Still longer than a restart (2 to 3 s on a busy 2-core box): a shorter lease ends while the
 * app is down, no retry ever meets a held key (409), and the wait the audits bound is never measured.
 */
export const crashLeaseSeconds = 4;

/** PostgreSQL for the crash audits; the schema of each file is created and dropped by it. */
export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** True when PostgreSQL answers; says loudly when not, and fails instead with CI=true. */
export async function postgresForCrashAudit(what: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: 2000 });
  try {
    await client.connect();
    await client.query('select 1');
    return true;
  } catch {
    const message = `PostgreSQL at ${databaseUrl} is not reachable: ${what} is SKIPPED.`;
    if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
    console.warn(`\n!!! ${message}\n`);
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** A DATABASE_URL for the same server with `schema` first on every connection's search_path. */
export function inSchema(url: string, schema: string): string {
  const parsed = new URL(url);
  parsed.searchParams.set('options', `-c search_path=${schema}`);
  return parsed.href;
}

/** One run of `start.mjs`: its output so far, whether it said it is ready, and how it ended. */
export interface AppRun {
  readonly child: ChildProcess;
  output(): string;
  /** Resolves once the app printed its last start-up line; rejects if it exits before. */
  readonly ready: Promise<void>;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  isReady(): boolean;
}

/**
 * Starts and kills the app on `schema`. Ports are picked once: the provider's issuer and the
 * gateway's audience are URLs with them, so tokens issued before a restart are only good after it
 * on the same ones.
 *
 * @example
 * const app = await killableApp('refapp_crash_1a2b');
 * const run = app.start();
 * await run.ready;
 * await app.kill(run);
 * await app.close();
 */
export async function killableApp(schema: string) {
  const ports: Record<string, number> = {};
  const picked = await restartablePorts(portVariables.length);
  portVariables.forEach((name, index) => {
    ports[name] = picked[index] as number;
  });
  const runs: AppRun[] = [];
  let current: AppRun | undefined;

  const start = (): AppRun => {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      DATABASE_URL: inSchema(databaseUrl, schema),
      IDEMPOTENCY_LEASE_SECONDS: String(crashLeaseSeconds),
    };
    // Charges keep their keys in the database whatever REDIS_URL says; without it the photos' keys
    // go there too (the app's Redis prefix is fixed, and would be shared with other runs).
    delete env.REDIS_URL;
    delete env.DATA_DIR;
    // Vitest sets BASE_URL ('/', Vite's base path) in its own environment; it is no gateway URL.
    delete env.BASE_URL;
    for (const [name, port] of Object.entries(ports)) env[name] = String(port);
    const child = spawn(process.execPath, ['examples/reference-app/start.mjs'], {
      cwd: root,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let output = '';
    let ready = false;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.once('exit', (code, signal) => resolve({ code, signal })),
    );
    const readyPromise = new Promise<void>((resolve, reject) => {
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        if (!ready && output.includes('Ctrl-C stops everything.')) {
          ready = true;
          resolve();
        }
      };
      child.stdout?.on('data', onData);
      child.stderr?.on('data', onData);
      void exited.then(({ code, signal }) =>
        reject(new Error(`the app exited (${signal ?? code}) before it was ready:\n${output}`)),
      );
    });
    readyPromise.catch(() => undefined);
    const run: AppRun = { child, output: () => output, ready: readyPromise, exited, isReady: () => ready };
    runs.push(run);
    current = run;
    return run;
  };

  const kill = async (run: AppRun): Promise<void> => {
    if (run.child.exitCode === null && run.child.signalCode === null && run.child.pid !== undefined) {
      process.kill(-run.child.pid, 'SIGKILL');
    }
    await run.exited;
  };

  return {
    ports,
    authUrl: `http://localhost:${ports.AUTH_PORT}`,
    appUrl: `http://localhost:${ports.APP_PORT}`,
    baseUrl: `http://localhost:${ports.GATEWAY_PORT}`,
    start,
    kill,
    /** The app running now, started if the last one is gone. */
    async running(): Promise<AppRun> {
      const run = current?.isReady() && current.child.exitCode === null ? current : start();
      await run.ready;
      return run;
    },
    /** Kills whatever is still running. */
    async close(): Promise<void> {
      await Promise.all(runs.map(kill));
    },
  };
}

/** Polls `sql` until it returns a row, `until()` says stop, or `ms` passed; true when a row came. */
export async function waitForRow(
  db: pg.Pool,
  sql: string,
  options: { ms: number; params?: unknown[]; until?: () => boolean },
): Promise<boolean> {
  const end = performance.now() + options.ms;
  while (performance.now() < end && !(options.until?.() ?? false)) {
    const { rows } = await db.query(sql, options.params ?? []).catch(() => ({ rows: [] as unknown[] }));
    if (rows.length > 0) return true;
  }
  return false;
}

/**
 * For one describe block: a schema of its own (made before, dropped after), a pool on it for the
 * test's own reads, and the killable app on it. Read the fields inside tests (they are set in beforeAll).
 */
export function useCrashSchema(prefix: string): {
  readonly schema: string;
  readonly admin: pg.Pool;
  readonly app: Awaited<ReturnType<typeof killableApp>>;
} {
  const schema = `${prefix}_${Math.random().toString(16).slice(2, 12)}`;
  const held = { schema } as { schema: string; admin: pg.Pool; app: Awaited<ReturnType<typeof killableApp>> };
  beforeAll(async () => {
    held.admin = new pg.Pool({ connectionString: inSchema(databaseUrl, schema), max: 3 });
    held.admin.on('error', () => undefined);
    await held.admin.query(`create schema ${schema}`);
    held.app = await killableApp(schema);
  });
  afterAll(async () => {
    await held.app?.close();
    await held.admin?.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
    await held.admin?.end();
  });
  return held;
}
