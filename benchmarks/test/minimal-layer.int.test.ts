// The minimal layer is the yardstick of the #4 targets: it must be an idempotency layer in earnest
// (one execution per key, replays of the same bytes), or its ratio would flatter nothing.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startCharges } from '../servers/charges.mjs';

const body = JSON.stringify({ amount: 1000, currency: 'usd' });

describe.each(['express', 'fastify', 'koa'])('minimal layer on %s', (framework) => {
  it('runs the handler once per key and replays its bytes', async () => {
    const server = await startCharges({ framework, variant: 'minimal' });
    try {
      const post = async (key?: string) => {
        const response = await fetch(`http://127.0.0.1:${server.port}/charges`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }) },
          body,
        });
        return {
          status: response.status,
          replayed: response.headers.get('idempotent-replayed'),
          text: await response.text(),
        };
      };
      const first = await post('k-1');
      expect(first.status).toBe(201);
      expect(first.replayed).toBeNull();
      const again = await post('k-1');
      expect(again).toEqual({ status: 201, replayed: 'true', text: first.text });
      // Another key, and no key at all, each run the handler: a new charge id.
      const other = await post('k-2');
      const none = await post();
      expect(new Set([first.text, other.text, none.text]).size).toBe(3);
      // Many at once on one new key: every answer is the one charge, or a 409 while it is in flight.
      const burst = await Promise.all(Array.from({ length: 30 }, () => post('k-3')));
      const charges = new Set(burst.filter((r) => r.status === 201).map((r) => r.text));
      expect(charges.size).toBe(1);
      expect(burst.every((r) => r.status === 201 || r.status === 409)).toBe(true);
    } finally {
      await server.close();
    }
  });
});
