import type { ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { type ProblemDetails, problemType } from '@idem/core';

/** How long a client waits, in seconds, before it asks a component that is starting again. */
export const startingUpRetryAfterSeconds = 1;

/**
 * The problem of a request that came before its component was ready: a port bound ahead of time (see
 * `listen.ts`) takes connections while the component is still being made, and the gateway while it
 * discovers the provider and sets up its guard. Retryable: the same request succeeds once it is up.
 */
export const startingUpProblem: ProblemDetails = {
  type: problemType('starting_up'),
  title: 'The service is starting',
  status: 503,
  detail: `The service is not ready yet; retry after ${startingUpRetryAfterSeconds} s with the same Idempotency-Key.`,
  code: 'starting_up',
  retryable: true,
};

const headers = {
  'Content-Type': 'application/problem+json',
  'Cache-Control': 'no-store',
  'Retry-After': String(startingUpRetryAfterSeconds),
};

/**
 * Answers `res` with the 503 {@link startingUpProblem} and `Retry-After`, whatever the request: none is
 * routed, parsed or checked before the component is ready, so none can get another answer.
 *
 * @example
 * ```ts
 * createServer((req, res) => (handler ? handler(req, res) : answerStartingUp(res)));
 * ```
 */
export function answerStartingUp(res: ServerResponse): void {
  const body = JSON.stringify(startingUpProblem);
  res.writeHead(503, { ...headers, 'Content-Length': Buffer.byteLength(body) }).end(body);
}

/**
 * The same answer to a request Node's HTTP parser refused before any handler saw it (a head that does
 * not parse, headers over the size limit), where Node's own would be a bare 400 or 431 with no body.
 * Then closes the connection, whose framing can no longer be trusted.
 *
 * @example
 * ```ts
 * server.on('clientError', refuseStartingUp);
 * ```
 */
export function refuseStartingUp(error: Error & { code?: string }, socket: Duplex): void {
  // A reset connection has no one to answer.
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  if (socket.writable) {
    const body = JSON.stringify(startingUpProblem);
    const head = Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    socket.write(
      `HTTP/1.1 503 Service Unavailable\r\n${head}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(error);
}
