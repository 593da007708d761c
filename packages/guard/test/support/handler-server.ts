import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair } from 'jose';
import { afterEach } from 'vitest';

/** What a {@link handlerServer} does with each request. */
export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

/**
 * A JWKS endpoint (or any) on a loopback port whose handler a test sets and swaps: an answer, a
 * stall, a wrong status. Counts requests; closed after each test.
 */
export async function handlerServer(initial: Handler) {
  let handler = initial;
  let requests = 0;
  const server = createServer((req, res) => {
    requests++;
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const { port } = server.address() as AddressInfo;
  return {
    port,
    url: `http://127.0.0.1:${port}/jwks`,
    get requests() {
      return requests;
    },
    set(next: Handler) {
      handler = next;
    },
  };
}

/** A handler that answers `body` as JSON, with `headers` and `status`. */
export const jsonAnswer =
  (body: unknown, headers: Record<string, string> = {}, status = 200): Handler =>
  (_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(JSON.stringify(body));
  };

/** A fresh P-256 key pair: its public JWK and the private key to sign with. */
export async function esKey() {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  return { jwk: await exportJWK(publicKey), privateKey };
}
