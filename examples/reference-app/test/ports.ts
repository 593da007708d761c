import { readFileSync } from 'node:fs';
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

// The kernel's range of ephemeral ports (Linux), from which every `listen(0)` and every outgoing
// connection takes one. A port outside it is never handed to another test's `listen(0)`.
function ephemeralRange(): [number, number] {
  try {
    const [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(low) && Number.isInteger(high)) return [low as number, high as number];
  } catch {
    // Not Linux: the IANA range.
  }
  return [49152, 65535];
}

/**
 * `count` loopback ports, all different, free right now and outside the kernel's ephemeral range, for
 * components that are told their ports and bind them again after a restart (a SIGKILL and a new
 * process on the same ports). A port from {@link freePorts} is free only until another test's
 * `listen(0)` takes it, which happened in CI between a kill and the restart ("APP_PORT: port ... is
 * already in use"); these ones no `listen(0)` is ever given. Each is held until all are chosen.
 */
export async function restartablePorts(count: number): Promise<number[]> {
  const [low] = ephemeralRange();
  // Below the ephemeral range and above the well-known and common service ports.
  const from = 20_000;
  const to = Math.max(from + 1_000, low) - 1;
  const servers: Server[] = [];
  try {
    while (servers.length < count) {
      const port = from + Math.floor(Math.random() * (to - from + 1));
      const server = createServer();
      const bound = await new Promise<boolean>((resolve) => {
        server.once('error', () => resolve(false));
        server.listen(port, '127.0.0.1', () => resolve(true));
      });
      if (bound) servers.push(server);
    }
    return servers.map((server) => (server.address() as { port: number }).port);
  } finally {
    await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  }
}
