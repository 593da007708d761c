// A node:http server on an ephemeral port that logs every request it gets (method, URL, headers,
// body) and counts its connections, then hands the request to the test's handler. Servers started
// here are closed by closeServers(), each test file's afterEach.
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A request as the server received it. */
export interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  /** The body's bytes. */
  body: Buffer;
  /** The body as UTF-8 text. */
  text: string;
}

const servers: Server[] = [];

/** Starts a logging server; `handler` answers the `n`th request (1-based). `port` 0 (default): any. */
export async function serve(handler: (req: IncomingMessage, res: ServerResponse, n: number) => void, port = 0) {
  const log: Seen[] = [];
  let connections = 0;
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    log.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body, text: body.toString('utf8') });
    handler(req, res, log.length);
  });
  server.on('connection', () => {
    connections++;
  });
  server.listen(port, '127.0.0.1');
  await once(server, 'listening');
  servers.push(server);
  const bound = (server.address() as AddressInfo).port;
  return { url: `http://127.0.0.1:${bound}`, log, connections: () => connections };
}

/** Has closeServers() close a server the test started itself (an Express app's, say). */
export function track<S extends Server>(server: S): S {
  servers.push(server);
  return server;
}

/** Closes every server `serve` started or `track` was given, cutting their open connections. */
export async function closeServers(): Promise<void> {
  await Promise.all(
    servers.splice(0).map(async (server) => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    }),
  );
}
