import { createServer, type Server } from 'node:net';

/**
 * `count` loopback ports free right now and all different, for components that must be told their
 * ports before they bind. Every one is held until all are chosen: a port taken and let go at once
 * may be handed out again by the next pick (seen in CI: API_PORT and RECEIVER_PORT given one port).
 */
export async function freePorts(count: number): Promise<number[]> {
  const servers: Server[] = [];
  try {
    for (let n = 0; n < count; n++) {
      const server = createServer();
      servers.push(server);
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    }
    return servers.map((server) => (server.address() as { port: number }).port);
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
}

/** A loopback port free right now, for a component that must be told its port before it binds. */
export async function freePort(): Promise<number> {
  return (await freePorts(1))[0] as number;
}
