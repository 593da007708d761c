import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What the local JWKS server answers; tests swap it between requests. */
export type JwksReply =
  // sendDate false: no Date header (Node adds one, with the real time, unless told not to).
  | { kind: 'json'; body: unknown; headers?: Record<string, string>; sendDate?: boolean }
  | { kind: 'raw'; status: number; body: string; headers?: Record<string, string> }
  | { kind: 'hang' }
  // Chosen when the request arrives, answered once `gate` settles: a fetch caught on its way.
  | { kind: 'gated'; gate: Promise<void>; reply: JwksReply }
  | { kind: 'destroy' };

/** A real HTTP JWKS endpoint on an ephemeral port, counting requests. */
export async function startJwksServer(initial: JwksReply) {
  let reply = initial;
  let requests = 0;
  const hanging: ServerResponse[] = [];
  const answer = (current: JwksReply, response: ServerResponse): void => {
    if (current.kind === 'hang') {
      hanging.push(response);
      return;
    }
    if (current.kind === 'gated') {
      void current.gate.then(() => answer(current.reply, response));
      return;
    }
    if (current.kind === 'destroy') {
      response.socket?.destroy();
      return;
    }
    if (current.kind === 'json') {
      response.sendDate = current.sendDate ?? true;
      response.writeHead(200, { 'content-type': 'application/json', ...current.headers });
      response.end(JSON.stringify(current.body));
      return;
    }
    response.writeHead(current.status, { 'content-type': 'application/json', ...current.headers });
    response.end(current.body);
  };
  const server = createServer((_request: IncomingMessage, response: ServerResponse) => {
    requests++;
    answer(reply, response);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/jwks`,
    origin: `http://127.0.0.1:${port}`,
    get requests() {
      return requests;
    },
    set(next: JwksReply) {
      reply = next;
    },
    async close() {
      for (const response of hanging) response.socket?.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
