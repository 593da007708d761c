// A TCP proxy that cuts one connection at a chosen byte, for exactly-once tests under connections
// cut at every point (the reference app's gateway, the webhook sender and receiver).
import net from 'node:net';

/** How a cut ends both sides: FIN (`fin`) or RST (`reset`). */
export type CutHow = 'fin' | 'reset';

/** What a {@link createCutProxy} saw on its latest connection: byte counts and the bytes each way. */
export interface CutProxyBytes {
  request: number;
  response: number;
  requestBytes: Buffer;
  responseBytes: Buffer;
}

/**
 * Closes `socket` from our side with a FIN and resolves once it is closed. A client that sees our FIN
 * drops the connection from its pool before it answers with its own, so once the answer arrives the
 * client cannot send its next request on this connection: an event, where a fixed pause would only
 * guess how long the client takes to notice. A peer that keeps its half open gets a reset after a
 * second.
 */
function closeByPeer(socket: net.Socket): Promise<void> {
  if (socket.closed) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const giveUp = setTimeout(() => socket.resetAndDestroy(), 1000);
    socket.once('close', () => {
      clearTimeout(giveUp);
      resolve();
    });
    socket.end();
  });
}

/**
 * A proxy that cuts the next connection once: after `at` bytes of the request (`request`) or of the
 * answer (`response`), by FIN on both sides (`fin`) or RST on both sides (`reset`). Later
 * connections pass untouched until armed again.
 */
export async function createCutProxy(targetPort: number) {
  let armed: { dir: 'request' | 'response'; at: number; how: CutHow } | undefined;
  const open = new Set<net.Socket>();
  // The client side of each open connection, to close through its peer when arming.
  const clients = new Set<net.Socket>();
  let cutsDone = 0;
  // Typed by hand: inferred, it is `Buffer<ArrayBuffer>` in the declarations, which TypeScript
  // before 5.7 (whose @types/node has no generic Buffer) refuses.
  const last: CutProxyBytes = {
    request: 0,
    response: 0,
    requestBytes: Buffer.alloc(0),
    responseBytes: Buffer.alloc(0),
  };
  const server = net.createServer((client) => {
    const plan = armed;
    armed = undefined;
    const upstream = net.connect(targetPort, '127.0.0.1');
    open.add(client);
    open.add(upstream);
    clients.add(client);
    client.on('error', () => undefined);
    upstream.on('error', () => undefined);
    let cut = false;
    const doCut = () => {
      cut = true;
      cutsDone++;
      if (plan?.how === 'reset') {
        if (!upstream.destroyed) upstream.resetAndDestroy();
        if (!client.destroyed) client.resetAndDestroy();
      } else {
        upstream.end();
        client.end();
        // Nothing more passes either way; both sockets go once their FIN is out.
        setTimeout(() => {
          upstream.destroy();
          client.destroy();
        }, 200);
      }
    };
    const forward = (from: net.Socket, to: net.Socket, dir: 'request' | 'response') => {
      let passed = 0;
      if (dir === 'request') {
        last.request = 0;
        last.requestBytes = Buffer.alloc(0);
      } else {
        last.response = 0;
        last.responseBytes = Buffer.alloc(0);
      }
      from.on('data', (chunk: Buffer) => {
        if (cut) return;
        last[dir] += chunk.length;
        if (dir === 'request') last.requestBytes = Buffer.concat([last.requestBytes, chunk]);
        else last.responseBytes = Buffer.concat([last.responseBytes, chunk]);
        if (plan && plan.dir === dir) {
          const room = plan.at - passed;
          if (chunk.length < room) {
            passed += chunk.length;
            to.write(chunk);
            return;
          }
          passed = plan.at;
          if (room > 0) to.write(chunk.subarray(0, room), () => doCut());
          else doCut();
          return;
        }
        to.write(chunk);
      });
      from.on('end', () => {
        if (!cut) to.end();
      });
    };
    forward(client, upstream, 'request');
    forward(upstream, client, 'response');
    const teardown = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
      clients.delete(client);
    };
    client.on('close', teardown);
    upstream.on('close', teardown);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as net.AddressInfo).port,
    /**
     * Cuts the next connection after `at` bytes going `dir`. Connections still open (a client's
     * keep-alive pool) are closed first, so the next request really opens the armed one.
     */
    async arm(dir: 'request' | 'response', at: number, how: CutHow) {
      await Promise.all([...clients].map(closeByPeer));
      armed = { dir, at, how };
    },
    /** Bytes seen each way on the latest connection. */
    last,
    get cuts() {
      return cutsDone;
    },
    close() {
      for (const socket of open) socket.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A running {@link createCutProxy}. */
export type CutProxy = Awaited<ReturnType<typeof createCutProxy>>;
