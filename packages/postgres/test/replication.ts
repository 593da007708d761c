// A PostgreSQL primary and a streaming standby of this test's own, in a scratch directory on
// loopback ports (never the shared server): initdb, pg_basebackup -R, pg_ctl promote. The standby
// reaches the primary through a TCP proxy, so a test can silence replication while the primary
// keeps answering its clients. initdb and pg_ctl refuse to run as root: as root, every command runs
// as the `postgres` user (runuser).
import { execFile } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { appendFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTcpProxy, serviceAvailable, type TcpProxy } from '@idem/testkit';
import pg from 'pg';

const binDir = (() => {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const newest = readdirSync(root)
    .filter((version) => existsSync(join(root, version, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a))[0];
  return newest === undefined ? undefined : join(root, newest, 'bin');
})();

const asRoot = process.getuid?.() === 0;

/** A port free on 127.0.0.1 now, for a server of the cluster to take. */
export const freePort = () =>
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

/** True when initdb, pg_basebackup and pg_ctl are installed; says so loudly when not. */
export const replicationAvailable = () =>
  serviceAvailable(
    'initdb/pg_basebackup/pg_ctl (/usr/lib/postgresql/*/bin)',
    binDir !== undefined,
    'the @idem/postgres failover tests',
  );

const run = (tool: string, args: readonly string[]) =>
  new Promise<string>((resolve, reject) => {
    const command = join(binDir as string, tool);
    const [file, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', command, ...args]] : [command, [...args]];
    execFile(file, argv, { timeout: 30_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${tool} failed: ${stderr || error.message}`)) : resolve(stdout),
    );
  });

/** The pair: connect to `primaryPort` or `standbyPort`; `link` is the standby's replication connection. */
export interface ReplicatedCluster {
  readonly primaryPort: number;
  readonly standbyPort: number;
  readonly link: TcpProxy;
  /** A client on `port`, with the 'error' listener every owner must attach. */
  client(port: number): Promise<pg.Client>;
  /** Sets `name = value` on the primary (ALTER SYSTEM) and reloads its configuration. */
  configurePrimary(name: string, value: string): Promise<void>;
  /** Waits until the standby streams from the primary (and is synchronous, when asked). */
  streaming(sync?: boolean): Promise<void>;
  /** Waits until the standby has replayed everything the primary has written so far. */
  caughtUp(): Promise<void>;
  /** Ends the primary as a crash would: SIGKILL of all its processes (see `crash`). */
  crashPrimary(): Promise<void>;
  /** Promotes the standby and waits until it takes writes. */
  promote(): Promise<void>;
  stop(): Promise<void>;
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// /proc/<pid>/stat: "pid (comm) state ppid ...": comm may hold spaces, so it is read after the last ')'.
export const procStat = (pid: number): { state: string; ppid: number } | undefined => {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const [state, ppid] = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return { state: state as string, ppid: Number(ppid) };
  } catch {
    return undefined;
  }
};
// A zombie has let go of its sockets and files: only its parent's wait is left of it.
export const running = (pid: number) => {
  const found = procStat(pid);
  return found !== undefined && found.state !== 'Z';
};
export const childrenOf = (pid: number) =>
  readdirSync('/proc')
    .map(Number)
    .filter((child) => Number.isSafeInteger(child) && procStat(child)?.ppid === pid);
const signal = (pid: number, name: NodeJS.Signals) => {
  try {
    process.kill(pid, name);
  } catch {
    // gone already
  }
};
// What each process was doing, for the error when one outlives its SIGKILL.
const describeProcesses = (pids: readonly number[]) =>
  new Promise<string>((done) =>
    execFile('ps', ['-o', 'pid,ppid,stat,wchan:32,etime,args', '-p', pids.join(',')], (_, stdout) => done(stdout)),
  );

/**
 * Ends the server of `data` as a crash of its machine would: every process of it SIGKILLed at once,
 * nothing flushed, no connection answered after. The postmaster is held still (SIGSTOP) while its
 * children are killed, so it forks no other, then killed itself; its shared memory segment is removed
 * (a postmaster that is killed leaves it behind). Resolves once none of them runs.
 *
 * Not `pg_ctl stop -m immediate`: twice under CI load it did not end within 20 s. An immediate
 * shutdown still accepts connections while it waits for its children, each answered by a "dead-end"
 * child the shutdown's SIGQUIT and SIGKILL skip, which waits authentication_timeout (60 s) for its
 * startup packet; the standby's walreceiver, reconnecting through the link a test silenced, sends
 * one that never arrives, and the postmaster waits for that child (replication.int.test.ts).
 */
async function crash(data: string): Promise<void> {
  const pidFile = join(data, 'postmaster.pid');
  if (!existsSync(pidFile)) return;
  // postmaster.pid: the pid on line 1; line 7 the shared memory key and id.
  const lines = readFileSync(pidFile, 'utf8').split('\n');
  const pid = Number(lines[0]);
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`${pidFile} names no postmaster: ${lines[0]}`);
  // A pid file left by a server already gone, its pid perhaps another process's now.
  let command = '';
  try {
    command = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return;
  }
  if (!command.includes(data)) return;
  signal(pid, 'SIGSTOP');
  const children = childrenOf(pid);
  for (const child of children) signal(child, 'SIGKILL');
  signal(pid, 'SIGKILL');
  const all = [pid, ...children];
  const deadline = Date.now() + 10_000;
  while (all.some(running)) {
    if (Date.now() > deadline) {
      const left = all.filter(running);
      throw new Error(`the server of ${data} outlived its SIGKILL by 10 s:\n${await describeProcesses(left)}`);
    }
    await pause(20);
  }
  const shmid = lines[6]?.trim().split(/\s+/)[1];
  if (shmid !== undefined && /^\d+$/.test(shmid) && shmid !== '0') {
    await new Promise<void>((done) => execFile('ipcrm', ['-m', shmid], () => done()));
  }
}

/** Starts the primary and its standby on the given free ports, and waits until the standby streams. */
export async function startReplicatedCluster(primaryPort: number, standbyPort: number): Promise<ReplicatedCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-pg-failover-'));
  if (asRoot) chownSync(dir, ...(await postgresIds()));
  const primary = join(dir, 'primary');
  const standby = join(dir, 'standby');
  const link = await createTcpProxy({ target: { host: '127.0.0.1', port: primaryPort } });
  const started: string[] = [];
  const stop = async () => {
    for (const data of started) await crash(data).catch(() => undefined);
    await link.close();
    rmSync(dir, { recursive: true, force: true });
  };
  const connect = async (port: number) => {
    const client = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', database: 'postgres' });
    client.on('error', () => undefined);
    await client.connect();
    return client;
  };
  const query = async (port: number, text: string) => {
    const client = await connect(port);
    try {
      return (await client.query(text)).rows;
    } finally {
      await client.end().catch(() => undefined);
    }
  };
  try {
    await run('initdb', ['-D', primary, '-U', 'postgres', '--auth=trust', '--no-sync']);
    // fsync is off: these tests replace a server, they do not crash the machine.
    await appendConf(primary, [
      `port = ${primaryPort}`,
      "listen_addresses = '127.0.0.1'",
      `unix_socket_directories = '${dir}'`,
      'fsync = off',
      'shared_buffers = 16MB',
      'max_connections = 40',
    ]);
    await appendFile(join(primary, 'pg_hba.conf'), 'host replication all 127.0.0.1/32 trust\n');
    await run('pg_ctl', ['-D', primary, '-l', join(dir, 'primary.log'), 'start', '-w']);
    started.push(primary);
    await run('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', standby, '-R']);
    // The standby's own port, and its replication connection through the proxy: in
    // postgresql.auto.conf, where pg_basebackup -R wrote the direct one, so this one wins.
    await appendConf(standby, [`port = ${standbyPort}`, "wal_retrieve_retry_interval = '200ms'"]);
    await appendFile(
      join(standby, 'postgresql.auto.conf'),
      `primary_conninfo = 'host=127.0.0.1 port=${link.port} user=postgres application_name=standby'\n`,
    );
    await run('pg_ctl', ['-D', standby, '-l', join(dir, 'standby.log'), 'start', '-w']);
    started.push(standby);
    const cluster: ReplicatedCluster = {
      primaryPort,
      standbyPort,
      link,
      client: connect,
      configurePrimary: async (name, value) => {
        const client = await connect(primaryPort);
        try {
          await client.query(`ALTER SYSTEM SET ${name} = ${pg.escapeLiteral(value)}`);
          await client.query('SELECT pg_reload_conf()');
        } finally {
          await client.end().catch(() => undefined);
        }
      },
      streaming: async (sync = false) => {
        const deadline = Date.now() + 30_000;
        for (;;) {
          const rows = await query(primaryPort, 'SELECT state, sync_state FROM pg_stat_replication').catch(() => []);
          if (rows.some((row) => row.state === 'streaming' && (!sync || row.sync_state === 'sync'))) return;
          if (Date.now() > deadline) throw new Error('the standby never streamed from the primary');
          await pause(50);
        }
      },
      caughtUp: async () => {
        const [{ lsn }] = await query(primaryPort, 'SELECT pg_current_wal_lsn()::text AS lsn');
        const deadline = Date.now() + 30_000;
        for (;;) {
          const [{ done }] = await query(standbyPort, `SELECT pg_last_wal_replay_lsn() >= '${lsn}'::pg_lsn AS done`);
          if (done === true) return;
          if (Date.now() > deadline) throw new Error('the standby never caught up');
          await pause(20);
        }
      },
      crashPrimary: async () => {
        await crash(primary);
        started.splice(started.indexOf(primary), 1);
      },
      promote: async () => {
        await run('pg_ctl', ['-D', standby, 'promote', '-w']);
        const deadline = Date.now() + 30_000;
        while ((await query(standbyPort, 'SELECT pg_is_in_recovery() AS recovering'))[0]?.recovering !== false) {
          if (Date.now() > deadline) throw new Error('the standby never left recovery');
          await pause(50);
        }
      },
      stop,
    };
    await cluster.streaming();
    return cluster;
  } catch (error) {
    await stop();
    throw error;
  }
}

const appendConf = (data: string, lines: readonly string[]) =>
  appendFile(join(data, 'postgresql.conf'), `\n${lines.join('\n')}\n`);

// The uid and gid of the postgres user, who must own the scratch directory when we run as root.
const postgresIds = () =>
  new Promise<[number, number]>((resolve, reject) =>
    execFile('id', ['-u', 'postgres'], (error, uid) =>
      error
        ? reject(error)
        : execFile('id', ['-g', 'postgres'], (again, gid) =>
            again ? reject(again) : resolve([Number(uid.trim()), Number(gid.trim())]),
          ),
    ),
  );
