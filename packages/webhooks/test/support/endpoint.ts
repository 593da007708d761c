// A real HTTP endpoint in front of a receiver, that can hold or drop its acknowledgements, and
// counts what reached it per webhook id.
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Receiver } from '../../src/index.js';

export type AckMode = 'send' | 'hold' | 'drop';

export interface Endpoint {
  url: string;
  /** Requests that reached the receiver, per webhook-id. */
  requests: Map<string, number>;
  /** The headers of every request that reached the receiver, in order. */
  headers: IncomingHttpHeaders[];
  /** How the next acknowledgements are treated; a function sees each delivery's id. */
  setMode(mode: AckMode | ((id: string) => AckMode)): void;
  close(): Promise<void>;
}

async function read(request: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

export async function startEndpoint(receiver: Receiver): Promise<Endpoint> {
  const requests = new Map<string, number>();
  const headers: IncomingHttpHeaders[] = [];
  let mode: AckMode | ((id: string) => AckMode) = 'send';
  const server: Server = createServer(async (request, response) => {
    const body = await read(request);
    const id = String(request.headers['webhook-id']);
    requests.set(id, (requests.get(id) ?? 0) + 1);
    headers.push(request.headers);
    const result = await receiver.handle({ headers: request.headers, body });
    const chosen = typeof mode === 'function' ? mode(id) : mode;
    // 'hold' leaves the sender waiting (it times out or its process dies); 'drop' cuts the
    // connection after the effect was applied: both are a lost acknowledgement.
    if (chosen === 'hold') return;
    if (chosen === 'drop') {
      request.socket.destroy();
      return;
    }
    response.writeHead(result.status, result.headers);
    response.end(Buffer.from(result.body));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
    requests,
    headers,
    setMode: (next) => {
      mode = next;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * An endpoint that reads each delivery and answers `429` with `Retry-After: <retryAfter>`, for the
 * relay's hold on a throttling URL.
 */
export async function startThrottlingEndpoint(retryAfter = '60'): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => response.writeHead(429, { 'retry-after': retryAfter }).end());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
