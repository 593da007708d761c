// What the Express test files share.
import type { AddressInfo } from 'node:net';
import type { Express } from 'express';

/** Runs `run` against `app` listening on an ephemeral loopback port, then closes every connection. */
export async function serve(app: Express, run: (url: string) => Promise<void>) {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
