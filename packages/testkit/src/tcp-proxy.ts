import net from 'node:net';

/** Options of {@link createTcpProxy}. */
export interface TcpProxyOptions {
  /** Where the proxy forwards to. */
  target: { host: string; port: number };
  /** Port to listen on (default 0: an ephemeral port on 127.0.0.1). */
  port?: number | undefined;
}

/** A controllable TCP proxy between a client (a server under test) and a store or peer. */
export interface TcpProxy {
  /** `host:port` to point the client at. */
  readonly host: string;
  readonly port: number;
  /** Adds `ms` of latency to every chunk in both directions, from now on (0 to stop). */
  delay(ms: number): void;
  /**
   * Silently swallows traffic from now on: connections stay open but nothing gets through, like a
   * network partition or a peer that stopped answering. `direction` limits it to one way:
   * `'upstream'` drops what the client sends, `'downstream'` drops the answers (lost acknowledgements).
   */
  blackhole(direction?: 'both' | 'upstream' | 'downstream'): void;
  /** Drops each downstream chunk with probability `p` (0 to 1) using `random`: a lossy link. */
  lossy(p: number, random?: () => number): void;
  /** Destroys every open connection and refuses new ones until {@link TcpProxy.restore}. */
  cut(): void;
  /** Back to a clean pass-through: no delay, no loss, connections accepted. */
  restore(): void;
  /** Number of connections currently open through the proxy. */
  readonly connections: number;
  close(): Promise<void>;
}

/**
 * Starts a TCP proxy whose faults a test switches on and off: latency, a blackhole, a lossy link,
 * cut connections. Point a Redis or PostgreSQL client at it to see what a server under test does
 * when its store is slow, silent or gone.
 *
 * @example
 * import { Redis } from 'ioredis';
 * const proxy = await createTcpProxy({ target: { host: '127.0.0.1', port: 6379 } });
 * const redis = new Redis({ port: proxy.port });
 * proxy.cut();      // the store vanishes
 * proxy.restore();  // and comes back
 */
export async function createTcpProxy(options: TcpProxyOptions): Promise<TcpProxy> {
  let delayMs = 0;
  let hole: 'none' | 'both' | 'upstream' | 'downstream' = 'none';
  let loss = 0;
  let random: () => number = Math.random;
  let refusing = false;
  const open = new Set<net.Socket>();

  // Forwards chunks from one socket to the other, applying the faults in force when each chunk arrives.
  const pipe = (from: net.Socket, to: net.Socket, direction: 'upstream' | 'downstream') => {
    from.on('data', (chunk) => {
      if (hole === 'both' || hole === direction) return;
      if (direction === 'downstream' && loss > 0 && random() < loss) return;
      if (delayMs > 0) setTimeout(() => to.writable && to.write(chunk), delayMs);
      else if (to.writable) to.write(chunk);
    });
    from.on('end', () => to.end());
  };

  const server = net.createServer((client) => {
    if (refusing) {
      client.destroy();
      return;
    }
    const upstream = net.connect(options.target.port, options.target.host);
    open.add(client);
    open.add(upstream);
    const teardown = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on('error', teardown);
    upstream.on('error', teardown);
    client.on('close', teardown);
    upstream.on('close', teardown);
    pipe(client, upstream, 'upstream');
    pipe(upstream, client, 'downstream');
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, '127.0.0.1', () => resolve());
  });
  const address = server.address() as net.AddressInfo;

  return {
    host: '127.0.0.1',
    port: address.port,
    get connections() {
      return open.size / 2;
    },
    delay(ms) {
      delayMs = ms;
    },
    blackhole(direction = 'both') {
      hole = direction;
    },
    lossy(p, source = Math.random) {
      if (!(p >= 0 && p <= 1)) throw new TypeError('loss probability must be between 0 and 1');
      loss = p;
      random = source;
    },
    cut() {
      refusing = true;
      for (const socket of open) socket.destroy();
      open.clear();
    },
    restore() {
      delayMs = 0;
      hole = 'none';
      loss = 0;
      refusing = false;
    },
    close() {
      for (const socket of open) socket.destroy();
      open.clear();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
