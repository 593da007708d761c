// The failover harness itself (replication.ts): what its crash of the primary does on a slow box.
import { connect } from 'node:net';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import {
  childrenOf,
  freePort,
  procStat,
  type ReplicatedCluster,
  replicationAvailable,
  running,
  startReplicatedCluster,
} from './replication.js';

const available = await replicationAvailable();

// Connection attempts until the primary no longer takes one: "shutting down" (57P03) or nobody listening.
const shuttingDown = async (port: number) => {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const client = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', database: 'postgres' });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.end().catch(() => undefined);
    } catch {
      return;
    }
    if (Date.now() > deadline) throw new Error('the primary went on taking connections');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
};

describe.runIf(available)('the failover harness: crashPrimary', () => {
  let cluster: ReplicatedCluster | undefined;
  afterEach(async () => {
    await cluster?.stop();
    cluster = undefined;
  });

  // Seen in CI under load: `pg_ctl stop -m immediate` ran out its 20 s. While an immediate shutdown
  // waits for its children, the postmaster still accepts connections and forks a "dead-end" child
  // for each, to answer "shutting down"; the SIGQUIT and the SIGKILL of the shutdown were sent
  // before it existed and skip dead-end children, and it waits for a startup packet for
  // authentication_timeout (60 s). The standby's walreceiver, reconnecting through the link the
  // test silenced, sends one that never arrives, and the postmaster waits for that child. Alone the
  // shutdown is over before the walreceiver retries; on a loaded box its children take long enough
  // to die. Here a stopped backend holds the shutdown open, as load does, and a silent client connects.
  it('ends the primary within seconds when a client that never speaks connects during the crash, and leaves none of its processes', async () => {
    cluster = await startReplicatedCluster(await freePort(), await freePort());
    const held = await cluster.client(cluster.primaryPort);
    const [{ pid: backend }] = (await held.query('SELECT pg_backend_pid() AS pid')).rows as [{ pid: number }];
    const postmaster = procStat(backend)?.ppid as number;
    const children = childrenOf(postmaster);
    expect(children).toContain(backend);
    cluster.link.blackhole();
    process.kill(backend, 'SIGSTOP');
    const silent: ReturnType<typeof connect>[] = [];
    try {
      const started = Date.now();
      const crashing = cluster.crashPrimary();
      await shuttingDown(cluster.primaryPort);
      const socket = connect(cluster.primaryPort, '127.0.0.1');
      socket.on('error', () => undefined);
      silent.push(socket);
      await crashing;
      expect(Date.now() - started).toBeLessThan(10_000);
      expect([postmaster, ...children].filter(running)).toEqual([]);
    } finally {
      if (running(backend)) process.kill(backend, 'SIGKILL');
      for (const socket of silent) socket.destroy();
      await held.end().catch(() => undefined);
    }
  }, 60_000);
});
