// Node writes a head in Latin-1 (one byte for each character up to U+00FF), except when it joins it
// to the first string it writes in UTF-8 (or with no encoding): then the whole head went out in
// UTF-8. The replay (writeResponse) writes Latin-1, so a phrase or header value with such a
// character went out as two bytes in the first answer and one in its replay. Each way a handler can
// write its answer through plain node:http, read off a raw socket: the replay's head bytes are the
// first answer's, held or not.
import type { ServerResponse } from 'node:http';
import { type RawAnswer, sendRaw } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import { serve } from './capture-server.js';
import { body, latin1, location, phrase, request, statusLine, value } from './support/raw-head.js';

// The status line and the Location value, as hex, to compare a first answer with its replay.
const head = (answer: RawAnswer) => ({
  statusLine: statusLine(answer).toString('hex'),
  location: value(answer, 'location')?.toString('hex'),
});

const ways: [string, (res: ServerResponse) => void][] = [
  [
    'writeHead with a phrase, then end(string)',
    (res) => {
      res.writeHead(201, phrase, { location, 'content-type': 'application/json' });
      res.end(body);
    },
  ],
  [
    'statusMessage set, then end(string, utf8)',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = phrase;
      res.setHeader('location', location);
      res.end(body, 'utf8');
    },
  ],
  [
    'write(string) with a Content-Length, whole',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = phrase;
      res.setHeader('location', location);
      res.setHeader('content-length', Buffer.byteLength(body));
      res.write(body);
      // Settled at the last declared byte already; the end only lets the connection close.
      res.end();
    },
  ],
  [
    'write(string) then end(), chunked',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = phrase;
      res.setHeader('location', location);
      res.write(body.slice(0, 5));
      res.end(body.slice(5));
    },
  ],
  [
    'end(Buffer)',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = phrase;
      res.setHeader('location', location);
      res.end(Buffer.from(body));
    },
  ],
  [
    'flushHeaders(), then end(string)',
    (res) => {
      res.statusCode = 201;
      res.statusMessage = phrase;
      res.setHeader('location', location);
      res.setHeader('content-length', Buffer.byteLength(body));
      res.flushHeaders();
      res.end(body);
    },
  ],
];

describe.each([false, true])('held: %s', (hold) => {
  it.each(ways)('%s: the replay sends the bytes of the first answer head, in Latin-1', async (_, answer) => {
    const served = await serve({ hold, answer: (res) => answer(res) });
    try {
      const port = Number(new URL(served.base).port);
      const first = await sendRaw(port, request('k-1'));
      const again = await sendRaw(port, request('k-1'));
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(served.runs()).toBe(1);
      const [sent, replayed] = [head(first), head(again)];
      // Was wrong (held: false, a string end): the first answer's head went out in UTF-8, its replay's in Latin-1.
      expect(replayed.statusLine).toBe(sent.statusLine);
      expect(replayed.location).toBe(sent.location);
      expect(sent.statusLine).toBe(latin1(`HTTP/1.1 201 ${phrase}`).toString('hex'));
      expect(sent.location).toBe(latin1(` ${location}`).toString('hex'));
      expect(again.body.toString()).toBe(body);
      expect(first.body.toString()).toBe(body);
    } finally {
      await served.close();
    }
  });
});
