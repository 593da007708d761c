import { createServer, type RequestListener, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { drainable } from './drain.js';
import { withOriginForm } from './request-target.js';
import { answerStartingUp, refuseStartingUp } from './starting-up.js';

/**
 * A listening HTTP port whose handler is attached later. Components need each other's URLs before
 * they can be configured (the app's redirect URI is registered at the provider, the provider's issuer
 * is the app's discovery URL), and with ephemeral ports those URLs exist only once a port is bound.
 *
 * @example
 * ```ts
 * const port = await listen(0);
 * port.use(handler);
 * console.log(port.url); // http://localhost:40123
 * await port.close();
 * ```
 */
export interface ListeningPort {
  readonly server: Server;
  readonly port: number;
  /** `http://localhost:<port>` unless a public URL was given. */
  readonly url: string;
  /**
   * Attaches the handler. It sees origin-form targets only, unless `targets` is `'as-sent'`: then it
   * takes absolute-form targets itself (the gateway, which serves only those naming its own origin).
   */
  use(handler: RequestListener, targets?: 'origin-form' | 'as-sent'): void;
  /** Stops accepting; requests already running finish first (see {@link drainable}). */
  close(graceMs?: number): Promise<void>;
}

/**
 * Binds a port (0 for an ephemeral one) on loopback. Until {@link ListeningPort.use} is called every
 * request gets 503 with `Retry-After`, an `application/problem+json` `starting_up` (see
 * `starting-up.ts`), so nothing half-configured ever answers; a request Node's parser refuses too. The handler sees origin-form targets
 * only unless told otherwise (see {@link withOriginForm}; these ports serve the provider's and the
 * app's pages).
 *
 * @example
 * ```ts
 * const idpPort = await listen(Number(process.env.AUTH_PORT ?? 8081));
 * ```
 */
export async function listen(
  port: number,
  options: { host?: string; publicUrl?: string } = {},
): Promise<ListeningPort> {
  let handler: RequestListener | undefined;
  const server = createServer((req, res) => {
    if (handler) {
      handler(req, res);
      return;
    }
    answerStartingUp(res);
  });
  // Until a handler is attached: after that Node's own answer (or the handler's server's, such as
  // Fastify's, which adds its own listener) takes these again.
  server.on('clientError', refuseStartingUp);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const drain = drainable(server);
  const bound = (server.address() as AddressInfo).port;
  return {
    server,
    port: bound,
    url: options.publicUrl ?? `http://localhost:${bound}`,
    use(next, targets = 'origin-form') {
      server.off('clientError', refuseStartingUp);
      handler = targets === 'as-sent' ? next : withOriginForm(next, 'page');
    },
    close(graceMs) {
      return drain.close(graceMs);
    },
  };
}
