// The Express rows must measure idem mounted as the guide and the examples mount it: before
// express.json(), reading the raw body and handing it on. The yardstick layers sit in the same place.
// Seen from outside: a body the parser refuses is then an outcome of the key (stored and replayed),
// whereas a layer after the parser never sees that request at all.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startCharges } from '../servers/charges.mjs';

describe.each([
  { variant: 'idem', store: 'memory' },
  { variant: 'minimal', store: undefined },
])('the Express $variant server', (spec) => {
  it('puts the layer before the body parser', async () => {
    const server = await startCharges({ framework: 'express', ...spec });
    try {
      const post = async (body: string) => {
        const response = await fetch(`http://127.0.0.1:${server.port}/charges`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': 'bad-json-1' },
          body,
        });
        await response.arrayBuffer();
        return { status: response.status, replayed: response.headers.get('idempotent-replayed') };
      };
      expect(await post('{"amount":')).toEqual({ status: 400, replayed: null });
      expect(await post('{"amount":')).toEqual({ status: 400, replayed: 'true' });
    } finally {
      await server.close();
    }
  });
});
