// Node writes a head in Latin-1 (one byte for each character up to U+00FF), except when it joins it
// to the first string it writes in UTF-8 (or with no encoding): then the whole head went out in
// UTF-8. The replay (writeResponse) writes Latin-1, so a phrase or header value with such a
// character went out as two bytes in the first answer and one in its replay. Each way a handler can
// write its answer through plain node:http, read off a raw socket: the replay's head bytes are the
// first answer's, held or not.
import type { ServerResponse } from 'node:http';
import { frameRequest, type RawAnswer, sendRaw } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import { serve } from './capture-server.js';

const phrase = 'Créé ¤ ÿ';
const location = '/charges/café';
const body = '{"id":"ch_1","note":"é"}';

// The status line and the value bytes of each header, by lower-case name.
function head(answer: RawAnswer) {
  const end = answer.raw.indexOf('\r\n\r\n');
  const lines: Buffer[] = [];
  for (let at = 0; at < end; ) {
    const next = answer.raw.indexOf('\r\n', at);
    lines.push(answer.raw.subarray(at, Math.min(next, end)));
    at = next + 2;
  }
  const [statusLine, ...fields] = lines;
  const values = new Map<string, string>();
  for (const line of fields) {
    const colon = line.indexOf(':');
    values.set(line.subarray(0, colon).toString('latin1').toLowerCase(), line.subarray(colon + 1).toString('hex'));
  }
  return { statusLine: statusLine?.toString('hex'), values };
}

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

const request = (key: string) =>
  frameRequest(
    `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n`,
    Buffer.alloc(0),
  ).bytes;

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
      expect(replayed.values.get('location')).toBe(sent.values.get('location'));
      expect(sent.statusLine).toBe(Buffer.from(`HTTP/1.1 201 ${phrase}`, 'latin1').toString('hex'));
      expect(sent.values.get('location')).toBe(Buffer.from(` ${location}`, 'latin1').toString('hex'));
      expect(again.body.toString()).toBe(body);
      expect(first.body.toString()).toBe(body);
    } finally {
      await served.close();
    }
  });
});
