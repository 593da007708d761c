// A real PgBouncer in front of the test PostgreSQL, for the audits of the stores and the outbox
// behind a connection pooler (branch audit-pgbouncer). Each call starts a process of its own, on an
// ephemeral port, with its own ini file in a temporary folder, and stop() ends that process by its
// pid. PgBouncer is no service of the CI: where its binary is missing the files that need it say so
// loudly and skip (set PGBOUNCER to the binary's path if it is not at /usr/sbin/pgbouncer).
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/** Where the PgBouncer binary is, or undefined. */
export function pgBouncerBinary(): string | undefined {
  const candidates = [process.env.PGBOUNCER, '/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];
  return candidates.find((path): path is string => typeof path === 'string' && path !== '' && existsSync(path));
}

/** True when a PgBouncer binary is there; says loudly what is skipped when not. */
export function pgBouncerAvailable(skipped: string): boolean {
  if (pgBouncerBinary() !== undefined) return true;
  console.warn(
    `\n!!! PgBouncer is not installed (apt-get install pgbouncer, or PGBOUNCER=path): ${skipped} are SKIPPED.\n`,
  );
  return false;
}

export interface PgBouncerOptions {
  /** The PostgreSQL behind it: its host, port and user are used; any database name is passed on. */
  databaseUrl: string;
  poolMode: 'transaction' | 'session';
  /** Server connections per database and user. */
  poolSize: number;
  /** More `[pgbouncer]` settings (query_wait_timeout, max_client_conn, ...). */
  settings?: Record<string, string | number>;
  /** Roles besides the URL's user that may log in (trust). */
  users?: string[];
}

export interface PgBouncer {
  /** `databaseUrl` with PgBouncer's host and port. */
  readonly url: string;
  readonly port: number;
  /** Runs a command of PgBouncer's admin console (`SHOW POOLS`, `SHOW STATS`). */
  admin(command: string): Promise<Record<string, unknown>[]>;
  /** Ends the process (SIGTERM, immediate shutdown; SIGKILL if it lingers) and removes its folder. */
  stop(): Promise<void>;
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });

const answers = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = tcpConnect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });

const exited = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
  });

/**
 * Starts PgBouncer in front of `databaseUrl`. Run as root (a container), it switches to the
 * `postgres` user, since PgBouncer refuses to run as root.
 */
export async function startPgBouncer(options: PgBouncerOptions): Promise<PgBouncer> {
  const binary = pgBouncerBinary();
  if (binary === undefined) throw new Error('PgBouncer is not installed');
  const target = new URL(options.databaseUrl);
  const user = decodeURIComponent(target.username || 'postgres');
  const dir = mkdtempSync(join(tmpdir(), 'idem-pgbouncer-'));
  const asRoot = process.getuid?.() === 0;
  const users = [user, ...(options.users ?? [])];
  writeFileSync(join(dir, 'users.txt'), users.map((name) => `"${name}" ""\n`).join(''));
  const settings: Record<string, string | number> = {
    listen_addr: '127.0.0.1',
    unix_socket_dir: '',
    auth_type: 'trust',
    auth_file: join(dir, 'users.txt'),
    pool_mode: options.poolMode,
    default_pool_size: options.poolSize,
    max_client_conn: 500,
    admin_users: user,
    // pg sends none of these by default; a Pool with `options` would be refused (see docs/stores.md).
    ignore_startup_parameters: 'extra_float_digits',
    // Kept in the folder, read by a test that fails.
    logfile: join(dir, 'pgbouncer.log'),
    ...options.settings,
  };
  const host = target.hostname === 'localhost' ? '127.0.0.1' : target.hostname;
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    writeFileSync(
      join(dir, 'pgbouncer.ini'),
      `[databases]\n* = host=${host} port=${target.port || 5432}\n[pgbouncer]\nlisten_port = ${port}\n${Object.entries(
        settings,
      )
        .map(([key, value]) => `${key} = ${value}`)
        .join('\n')}\n`,
    );
    if (asRoot) {
      const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
      for (const file of ['', 'users.txt', 'pgbouncer.ini']) chownSync(join(dir, file), uid, gid);
    }
    const args = asRoot ? ['-u', 'postgres', join(dir, 'pgbouncer.ini')] : [join(dir, 'pgbouncer.ini')];
    const child = spawn(binary, args, { stdio: 'ignore' });
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && child.exitCode === null && !(await answers(port))) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    if (child.exitCode !== null || !(await answers(port))) {
      child.kill('SIGKILL');
      // The port was taken between freePort() and the bind: another try.
      if (attempt < 3) continue;
      throw new Error(`PgBouncer did not start (see ${dir}/pgbouncer.log)`);
    }
    const url = new URL(options.databaseUrl);
    url.hostname = '127.0.0.1';
    url.port = String(port);
    return {
      url: url.toString(),
      port,
      async admin(command) {
        const admin = new pg.Client({ host: '127.0.0.1', port, user, database: 'pgbouncer' });
        await admin.connect();
        try {
          // The console speaks the simple protocol only.
          return (await admin.query(command)).rows;
        } finally {
          await admin.end();
        }
      },
      async stop() {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited(child);
        clearTimeout(timer);
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
}
