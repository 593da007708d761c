// A reason phrase Node refuses to write (a character over U+00FF, a line break, a control): its
// writeHead throws ERR_INVALID_CHAR once the handler made its effect. The capture drops it before
// the head leaves, by every way a head can leave, held (transactional) or not: the answer goes out
// with its status and the default phrase, is stored without a phrase, and is replayed so.
import type { ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { ownReasonPhrase } from '../src/index.js';
import { networkLike, serve } from './capture-server.js';
import { captureWarningsEachTest } from './support/warnings.js';

const body = '{"id":"ch_1"}';
const unwritable = ['Fehler \u2717', 'Created\r\nX-Injected: 1', 'Created\u0001', 'Created\u007f'];

// Each way a head leaves, with `phrase` set as the handler would.
const heads: Record<string, (res: ServerResponse, phrase: string) => void> = {
  'statusMessage, one end': (res, phrase) => {
    res.statusCode = 201;
    res.statusMessage = phrase;
    res.end(body);
  },
  'statusMessage, writes, then end': (res, phrase) => {
    res.statusCode = 201;
    res.statusMessage = phrase;
    res.write(body.slice(0, 5));
    res.end(body.slice(5));
  },
  'statusMessage, one write of every declared byte': (res, phrase) => {
    res.statusCode = 201;
    res.statusMessage = phrase;
    res.setHeader('content-length', Buffer.byteLength(body));
    res.write(body);
  },
  'writeHead(status, phrase, headers)': (res, phrase) => {
    res.writeHead(201, phrase, { 'content-type': 'application/json' }).end(body);
  },
  // The dropped one must not leave an earlier own phrase in its place.
  'an own phrase, then writeHead(status, phrase)': (res, phrase) => {
    res.statusMessage = 'Created Fine';
    res.writeHead(201, phrase).end(body);
  },
};

const warnings = captureWarningsEachTest();

describe('a reason phrase Node cannot write', () => {
  for (const hold of [false, true]) {
    for (const [how, write] of Object.entries(heads)) {
      it(`is dropped: ${how}${hold ? ', held' : ''}`, async () => {
        for (const [i, phrase] of unwritable.entries()) {
          const served = await serve({
            hold,
            ...(hold ? {} : { store: networkLike() }),
            answer: (res) => write(res, phrase),
          });
          try {
            // Was a defect: Node's writeHead threw, the response never carried the handler's answer,
            // and the store refused an outcome with the phrase, releasing the key.
            const first = await served.post(`p-${i}`);
            expect([first.status, first.statusMessage, first.body.toString()], phrase).toEqual([201, 'Created', body]);
            const again = await served.post(`p-${i}`);
            expect([again.status, again.statusMessage, again.headers['idempotent-replayed']]).toEqual([
              201,
              'Created',
              'true',
            ]);
            expect(again.body.toString()).toBe(body);
            expect(served.runs()).toBe(1);
          } finally {
            await served.close();
          }
        }
        await new Promise((resolve) => setImmediate(resolve));
        // Once per instance: each served() is one.
        expect(warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE')).toHaveLength(unwritable.length);
      });
    }
  }

  // Was wrong: the unwritable statusMessage was reported though the writeHead phrase replaced it.
  it('a writable writeHead phrase over an unwritable statusMessage goes out and is replayed, without a warning', async () => {
    for (const hold of [false, true]) {
      const served = await serve({
        hold,
        answer: (res) => {
          res.statusMessage = 'Created\r\nX-Injected: 1';
          res.writeHead(201, 'Created Fine').end(body);
        },
      });
      try {
        const first = await served.post('over');
        expect([first.status, first.statusMessage, first.body.toString()]).toEqual([201, 'Created Fine', body]);
        const again = await served.post('over');
        expect([again.statusMessage, again.headers['idempotent-replayed'], served.runs()]).toEqual([
          'Created Fine',
          'true',
          1,
        ]);
      } finally {
        await served.close();
      }
    }
    await new Promise((resolve) => setImmediate(resolve));
    expect(warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE')).toEqual([]);
  });

  it('is no own phrase to ownReasonPhrase; obs-text and a tab are', () => {
    const res = (statusMessage: string) => ({ statusMessage }) as ServerResponse;
    for (const phrase of unwritable) expect(ownReasonPhrase(res(phrase), 201)).toBeUndefined();
    expect(ownReasonPhrase(res('Cr\u00e9\u00e9'), 201)).toBe('Cr\u00e9\u00e9');
    expect(ownReasonPhrase(res('Created\tFine'), 201)).toBe('Created\tFine');
  });
});
