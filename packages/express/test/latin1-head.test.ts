// Heads with characters U+0080..U+00FF written by Express's own helpers (res.download's
// Content-Disposition, res.sendFile, res.redirect, res.send), read off a raw socket: the first
// answer's head leaves in Latin-1, as its replay does, and the body bytes are the handler's.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import { frameRequest, type RawAnswer, sendRaw, transactionalMemoryStore } from '@idem/testkit';
import express, { type Response } from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serve } from './support.js';

let dir: string;
let file: string;
const contents = 'reçu: 100 €\n';
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'idem-latin1-'));
  file = join(dir, 'receipt.txt');
  await writeFile(file, contents);
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function headOf(answer: RawAnswer): Buffer {
  return answer.raw.subarray(0, answer.raw.indexOf('\r\n\r\n'));
}

// The status line, then each header's value bytes by lower-case name.
function lines(answer: RawAnswer): { statusLine: string; byName: Map<string, string> } {
  const [statusLine = '', ...fields] = headOf(answer).toString('latin1').split('\r\n');
  const byName = new Map<string, string>();
  for (const field of fields) {
    const colon = field.indexOf(':');
    byName.set(field.slice(0, colon).toLowerCase(), field.slice(colon + 1));
  }
  return { statusLine, byName };
}

const request = (key: string) =>
  frameRequest(
    `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\n`,
    Buffer.from('{}'),
  ).bytes;

const phrase = 'Créé ¤ ÿ';

// Each: what the handler does, the headers whose value bytes the replay must repeat, and the body.
const ways: [string, (res: Response) => void, string[], () => Buffer][] = [
  [
    'res.download with a filename of such characters',
    (res) => {
      res.status(201);
      res.statusMessage = phrase;
      // Its Content-Disposition names it in ASCII and with filename*=UTF-8'': the phrase carries them.
      res.download(file, 'reçu naïve.txt');
    },
    ['content-disposition'],
    () => Buffer.from(contents),
  ],
  [
    'res.sendFile with such a Content-Disposition set',
    (res) => {
      res.status(201);
      res.set('content-disposition', 'inline; filename="reçu.txt"');
      res.sendFile(file);
    },
    ['content-disposition'],
    () => Buffer.from(contents),
  ],
  [
    'res.redirect to a Location with such characters',
    (res) => {
      res.statusMessage = phrase;
      // Express percent-encodes it (encodeurl): the phrase carries the characters.
      res.redirect(303, '/charges/café');
    },
    ['location'],
    () => Buffer.from('See Other. Redirecting to /charges/caf%C3%A9'),
  ],
  [
    'res.send(string) with a Location of such characters',
    (res) => {
      res.status(201).location('/charges/naïve');
      res.set('content-location', '/charges/ÿ');
      res.type('text/plain').send('créé');
    },
    ['content-location'],
    () => Buffer.from('créé'),
  ],
];

describe.each([false, true])('transactional: %s', (transactional) => {
  it.each(ways)('%s: the replay sends the head bytes of the first answer', async (_, answer, names, body) => {
    const app = express();
    app.use(express.json());
    const store = transactional ? transactionalMemoryStore() : memoryStore();
    app.use(idempotency({ store, scope: () => 'tenant-1', transactional, replayHeaders: ['content-location'] }));
    let runs = 0;
    app.post('/charges', (_req, res) => {
      runs++;
      answer(res);
    });
    await serve(app, async (url) => {
      const port = Number(new URL(url).port);
      const first = await sendRaw(port, request('k-1'));
      const again = await sendRaw(port, request('k-1'));
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
      const [sent, replayed] = [lines(first), lines(again)];
      expect(replayed.statusLine).toBe(sent.statusLine);
      for (const name of names) {
        const value = sent.byName.get(name) ?? '';
        // Latin-1: one byte per character, no UTF-8 pair (Ã) in it.
        expect(value.includes('Ã'), name).toBe(false);
        expect(replayed.byName.get(name), name).toBe(value);
      }
      expect(sent.statusLine.includes('Ã')).toBe(false);
      // Something in the head has such a character (Express encodes a Location and a download's
      // filename: there the phrase has them).
      const carried = [sent.statusLine, ...names.map((name) => sent.byName.get(name) ?? '')];
      expect(carried.some((text) => /[\u0080-\u00ff]/.test(text))).toBe(true);
      expect(first.body.toString('hex')).toBe(body().toString('hex'));
      expect(again.body.toString('hex')).toBe(body().toString('hex'));
    });
  });
});
