// Edges of the Latin-1 head (see latin1-head.test.ts) and of a head flushed early (flushHeaders),
// held or not, read off the wire.
import { describe, expect, it } from 'vitest';
import { serve } from './capture-server.js';

const body = '{"id":"ch_1","note":"é"}';

describe('held, flushHeaders() after writeHead', () => {
  it('the head the handler wrote is kept: its phrase and headers go out and are stored, plain ASCII too', async () => {
    const served = await serve({
      hold: true,
      answer: (res) => {
        res.writeHead(201, 'Created Fine', { location: '/charges/1', 'content-type': 'application/json' });
        res.flushHeaders();
        res.end(body);
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      // Was wrong: Node's flushHeaders wrote its implicit head, writeHead(201), over the held one:
      // `201 Created` went out and was stored, without the Location given.
      for (const answer of [first, again]) {
        expect([answer.status, answer.statusMessage, answer.headers.location]).toEqual([
          201,
          'Created Fine',
          '/charges/1',
        ]);
        expect(answer.body.toString()).toBe(body);
      }
    } finally {
      await served.close();
    }
  });
});
