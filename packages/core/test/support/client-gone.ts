import { request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'vitest';
import type { IdempotencyEvent } from '../../src/events.js';
import { recordId } from '../../src/record-id.js';
import type { gatedStore } from './gated-store.js';

/**
 * POSTs `body` (JSON) with `key` to `url`, and drops the connection once `leaveWhen` resolves (the
 * claim or the handler is running): a client that leaves. Resolves once it has left.
 *
 * @example
 * await abandonedPost(`${url}/charges`, 'gone-1', handlerRunning);
 */
export async function abandonedPost(url: string, key: string, leaveWhen: Promise<unknown>, body = '{}'): Promise<void> {
  const req = httpRequest(url, {
    method: 'POST',
    headers: {
      'idempotency-key': key,
      'content-type': 'application/json',
      'content-length': String(Buffer.byteLength(body)),
    },
  });
  req.on('error', () => undefined);
  req.end(body);
  await leaveWhen;
  req.destroy();
}

/**
 * The scenario every adapter's "client gone during the claim" test plays against its own `server`
 * (listening; its route `POST /charges` scoped to `tenant-1`, writing what it ran with into `runs`):
 * the client sends a charge, leaves while the gated claim waits, then the claim lands. Nothing may
 * run, the key must be released, and the client's retry must run once with its body.
 */
export async function leaveDuringClaim(
  server: Server,
  gated: ReturnType<typeof gatedStore>,
  events: IdempotencyEvent[],
  runs: unknown[],
): Promise<void> {
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const closed = new Promise<void>((resolve) => server.once('connection', (socket) => socket.once('close', resolve)));
  const body = JSON.stringify({ amount: 1000 });
  await abandonedPost(`${url}/charges`, 'gone', gated.claiming, body);
  await closed;
  gated.open();
  await expect.poll(() => events.map((event) => event.type)).toEqual(['claim', 'release']);
  expect(runs).toEqual([]);
  expect(await gated.inner.get(recordId('tenant-1', 'POST /charges', 'gone'))).toBeUndefined();
  const retry = await fetch(`${url}/charges`, {
    method: 'POST',
    headers: { 'idempotency-key': 'gone', 'content-type': 'application/json' },
    body,
  });
  expect(retry.status).toBe(201);
  expect(runs).toEqual([{ amount: 1000 }]);
}
