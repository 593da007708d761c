// A reason phrase set once the head has gone out (Node wrote it at writeHead: a flushHeaders() or a
// first write) is on no status line: the client read the phrase of that head. The replay must say
// the same one, not whatever `statusMessage` held at the end.
import type { ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { serve } from './capture-server.js';

const ways: [string, (res: ServerResponse) => void][] = [
  [
    'flushHeaders()',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = 'Created Fine';
      res.flushHeaders();
      res.statusMessage = 'Set Too Late';
      res.end('{"id":"ch_1"}');
    },
  ],
  [
    'a first write',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = 'Created Fine';
      res.write('{"id":');
      res.statusMessage = 'Set Too Late';
      res.end('"ch_1"}');
    },
  ],
  [
    'writeHead(status, phrase), then a write',
    (res) => {
      res.writeHead(201, 'Created Fine');
      res.write('{"id":');
      res.statusMessage = 'Set Too Late';
      res.end('"ch_1"}');
    },
  ],
  [
    'writeHead(status) with the default phrase, then a write',
    (res) => {
      res.writeHead(201);
      res.write('{"id":');
      res.statusMessage = 'Set Too Late';
      res.end('"ch_1"}');
    },
  ],
];

describe('not held: a phrase set after the head went out', () => {
  it.each(ways)('%s: the replay says the phrase the first answer went out with', async (name, answer) => {
    const served = await serve({ answer: (res) => answer(res) });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(first.statusMessage).toBe(name.includes('default') ? 'Created' : 'Created Fine');
      // Was wrong: the replay said `Set Too Late`, which no client ever read.
      expect([again.status, again.statusMessage]).toEqual([first.status, first.statusMessage]);
      expect(again.body.toString()).toBe(first.body.toString());
    } finally {
      await served.close();
    }
  });
});
