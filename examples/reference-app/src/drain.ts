import type { Server, ServerResponse } from 'node:http';

/** How long requests already running may take to finish once a server is closing. */
export const defaultGraceMs = 10_000;

/** The closing half of {@link drainable}. */
export interface Drain {
  /**
   * Stops accepting connections and resolves once every connection has ended. Requests already
   * running finish (up to `graceMs`, default {@link defaultGraceMs}); calling it again returns the same
   * promise.
   */
  close(graceMs?: number): Promise<void>;
}

/**
 * Lets a node:http server stop without cutting the requests it is serving. `server.close()` alone
 * stops accepting and drops idle keep-alive connections, but keeps a busy one open for its whole
 * keep-alive timeout after its response, and `closeAllConnections()` cuts requests mid-way: a charge
 * whose key is then left in progress until its lease runs out, a token request the client must
 * repeat. Here a busy connection is closed the moment its response is done, and whatever still runs
 * after the grace is cut, so a stuck handler cannot hold a shutdown forever. Every response not yet
 * begun says `Connection: close`: a client that reused the connection would race its closing and
 * get a reset (for a POST, an answer it cannot tell from a lost one), where a new connection is
 * refused, which is plainly safe to retry.
 *
 * Call it once, right after creating the server (it must see every request).
 *
 * @example
 * ```ts
 * const server = createServer(handler);
 * const drain = drainable(server);
 * // ...
 * await drain.close();
 * ```
 */
export function drainable(server: Server): Drain {
  let closing = false;
  const running = new Set<ServerResponse>();
  server.on('request', (_req, res) => {
    // This listener runs after the server's handler, which may have answered at once (a pipelined
    // request behind a running one, answered "Starting up" or 400): setHeader on a sent head throws,
    // out of the 'request' event, and the process dies in the middle of its shutdown.
    if (closing) {
      if (!res.headersSent) res.setHeader('connection', 'close');
    } else running.add(res);
    // By 'close' Node has detached the response from its socket, so the socket counts as idle.
    res.once('close', () => {
      running.delete(res);
      if (closing) server.closeIdleConnections();
    });
  });
  let closed: Promise<void> | undefined;
  return {
    close(graceMs = defaultGraceMs) {
      closed ??= new Promise<void>((resolve, reject) => {
        closing = true;
        for (const res of running) if (!res.headersSent) res.setHeader('connection', 'close');
        const cut = setTimeout(() => server.closeAllConnections(), graceMs);
        server.close((error) => {
          clearTimeout(cut);
          if (error) reject(error);
          else resolve();
        });
      });
      return closed;
    },
  };
}
