// The response capture of the HTTP layer (writeResponse, the wrapped writeHead, write and end, held and
// settled): behaviours that mutation testing of packages/core/src/http-write.ts and http-capture.ts showed no test held.
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import { gunzipSync, gzipSync } from 'node:zlib';
import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import type { ResponseCapture } from '../src/http-types.js';
import { writeResponse } from '../src/http-write.js';
import { memoryStore } from '../src/memory-store.js';
import { networkLike, plainServer, serve, waitFor } from './capture-server.js';
import { captureWarnings } from './support/warnings.js';

// The bytes a capture holds, read from its state (kept under a symbol of http-capture.ts's own).
function heldBytes(capture: ResponseCapture): number {
  const [key] = Object.getOwnPropertySymbols(capture);
  const state = (capture as unknown as Record<symbol, { chunks: Buffer[] } | undefined>)[key as symbol];
  if (state === undefined) throw new Error('the capture keeps its state under a symbol no more');
  return state.chunks.reduce((sum, chunk) => sum + chunk.length, 0);
}

const allBytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));

describe('writeResponse', () => {
  it('ends a response whose head already went out as it is, without throwing', async () => {
    let threw: unknown;
    let ended = false;
    const server = await plainServer((res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('partial');
      try {
        writeResponse(res, { status: 503, headers: { 'retry-after': '2' }, body: Buffer.from('{}') });
      } catch (error) {
        threw = error;
        res.destroy();
      }
      ended = res.writableEnded;
    });
    try {
      const got = await server.post();
      expect(threw).toBeUndefined();
      expect(ended).toBe(true);
      expect(got.status).toBe(200);
      expect(got.headers['retry-after']).toBeUndefined();
      expect(got.body.toString()).toBe('partial');
    } finally {
      await server.close();
    }
  });

  it('sends no Content-Length and no body with a 204 or a 304, and the exact length otherwise', async () => {
    for (const status of [204, 304, 200, 201]) {
      const server = await plainServer((res) =>
        writeResponse(res, { status, headers: { etag: '"v1"' }, body: Buffer.alloc(0) }),
      );
      try {
        const got = await server.post();
        expect(got.status).toBe(status);
        expect(got.headers.etag).toBe('"v1"');
        expect(got.headers['content-length']).toBe(status === 204 || status === 304 ? undefined : '0');
        expect(got.body.length).toBe(0);
      } finally {
        await server.close();
      }
    }
  });

  it('sends a body given as a view into a larger buffer as exactly the bytes of that view', async () => {
    const backing = new Uint8Array(64).fill(0x2a);
    backing.set([0xde, 0xad, 0xbe, 0xef, 0x00, 0xff], 10);
    const view = backing.subarray(10, 16);
    const server = await plainServer((res) =>
      writeResponse(res, { status: 201, headers: { 'content-type': 'application/octet-stream' }, body: view }),
    );
    try {
      const got = await server.post();
      expect(got.headers['content-length']).toBe('6');
      expect(got.body).toEqual(Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x00, 0xff]));
    } finally {
      await server.close();
    }
  });

  it('sends every byte value unchanged, in a small body and in one over 16 KiB', async () => {
    for (const body of [allBytes, Buffer.concat(Array.from({ length: 80 }, () => allBytes))]) {
      const server = await plainServer((res) => writeResponse(res, { status: 200, headers: {}, body }));
      try {
        const got = await server.post();
        expect(got.headers['content-length']).toBe(String(body.length));
        expect(got.body.equals(body)).toBe(true);
      } finally {
        await server.close();
      }
    }
  });

  it("states the body's own length in Content-Length, whatever length the headers passed in claim", async () => {
    const server = await plainServer((res) =>
      writeResponse(res, { status: 200, headers: { 'content-length': '99' }, body: Buffer.from('four') }),
    );
    try {
      const got = await server.post();
      expect(got.headers['content-length']).toBe('4');
      expect(got.body.toString()).toBe('four');
    } finally {
      await server.close();
    }
  });
});

describe('the headers a captured response keeps for its replay', () => {
  it('keeps headers given to writeHead with mixed-case names, as an object or a flat array', async () => {
    for (const head of [
      { 'Content-Type': 'text/csv', 'X-Charge-Version': '7', 'X-Request-Id': 'r-1' },
      ['Content-Type', 'text/csv', 'X-Charge-Version', '7', 'X-Request-Id', 'r-1'],
    ]) {
      const served = await serve({
        replayHeaders: ['X-Charge-Version'],
        answer: (res, run) => {
          res.writeHead(201, head).end(`run ${run}`);
        },
      });
      try {
        expect((await served.post('mixed')).headers['content-type']).toBe('text/csv');
        const again = await served.post('mixed');
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(again.status).toBe(201);
        expect(again.headers['content-type']).toBe('text/csv');
        expect(again.headers['x-charge-version']).toBe('7');
        expect(again.headers['x-request-id']).toBeUndefined();
        expect(again.body.toString()).toBe('run 1');
      } finally {
        await served.close();
      }
    }
  });

  it('keeps a header given several values (to writeHead or setHeader) as one list joined with ", "', async () => {
    const links = ['</p/2>; rel="next"', '</p/9>; rel="last"'];
    for (const how of ['writeHead', 'setHeader'] as const) {
      const served = await serve({
        answer: (res, run) => {
          if (how === 'setHeader') {
            res.setHeader('link', links);
            res.writeHead(201, { 'content-type': 'text/plain' });
          } else res.writeHead(201, { 'content-type': 'text/plain', link: links });
          res.end(`run ${run}`);
        },
      });
      try {
        const first = await served.post(`links-${how}`);
        expect(first.raw.filter((name) => name.toLowerCase() === 'link')).toHaveLength(2);
        const again = await served.post(`links-${how}`);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(again.headers.link).toBe(links.join(', '));
      } finally {
        await served.close();
      }
    }
  });

  it('keeps what writeHead gives over what setHeader set before it, as Node sends it', async () => {
    const served = await serve({
      answer: (res, run) => {
        res.setHeader('content-type', 'text/plain');
        res.setHeader('etag', '"old"');
        res.writeHead(201, { 'content-type': 'application/json', etag: '"new"' }).end(`{"run":${run}}`);
      },
    });
    try {
      const first = await served.post('override');
      expect(first.headers).toMatchObject({ 'content-type': 'application/json', etag: '"new"' });
      const again = await served.post('override');
      expect(again.headers).toMatchObject({
        'idempotent-replayed': 'true',
        'content-type': 'application/json',
        etag: '"new"',
      });
    } finally {
      await served.close();
    }
  });

  it("keeps the headers as the handler's writeHead gave them, not what a layer below adds to that head", async () => {
    // Like compression(), mounted before: it adds Content-Encoding when the head goes out and
    // compresses the bytes written through it, so the capture above it copies the plain bytes.
    const compressing = (res: ServerResponse) => {
      const writeHead = res.writeHead;
      const end = res.end;
      res.writeHead = function (this: ServerResponse, ...args: Parameters<ServerResponse['writeHead']>) {
        this.setHeader('content-encoding', 'gzip');
        return writeHead.apply(this, args);
      } as ServerResponse['writeHead'];
      res.end = function (this: ServerResponse, chunk?: string) {
        return (end as (chunk: Buffer) => ServerResponse).call(this, gzipSync(chunk ?? ''));
      } as ServerResponse['end'];
    };
    const served = await serve({
      below: compressing,
      answer: (res, run) => {
        res.writeHead(201, { 'content-type': 'text/plain' });
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('z');
      expect(first.headers['content-encoding']).toBe('gzip');
      expect(gunzipSync(first.body).toString()).toBe('run 1');
      const again = await served.post('z');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers['content-encoding']).toBeUndefined();
      expect(again.body.toString()).toBe('run 1');
    } finally {
      await served.close();
    }
  });

  it('gives `result` the complete response with only the headers a replay carries', async () => {
    let result: Promise<unknown> | undefined;
    const served = await serve({
      replayHeaders: ['x-charge-version'],
      answer: (res, run, capture) => {
        result = capture.result;
        res.setHeader('x-request-id', 'r-1');
        res.setHeader('x-charge-version', '2');
        res.writeHead(201, { 'content-type': 'text/plain', 'x-trace': 't-1', 'set-cookie': 'a=b' });
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('result');
      expect(first.headers['x-trace']).toBe('t-1');
      expect(await result).toEqual({
        kind: 'complete',
        response: {
          status: 201,
          headers: { 'content-type': 'text/plain', 'x-charge-version': '2' },
          body: Buffer.from('run 1'),
        },
      });
    } finally {
      await served.close();
    }
  });

  it('keeps the last replayable header name there is (a replayHeaders entry) when set with setHeader', async () => {
    const served = await serve({
      replayHeaders: ['x-charge-version'],
      answer: (res, run) => {
        res.statusCode = 201;
        res.setHeader('x-charge-version', '3');
        res.end(`run ${run}`);
      },
    });
    try {
      await served.post('last-name');
      const again = await served.post('last-name');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers['x-charge-version']).toBe('3');
    } finally {
      await served.close();
    }
  });

  it('takes writeHead with a reason phrase and no headers, and with a null reason before the headers', async () => {
    const heads: Array<(res: ServerResponse) => void> = [
      (res) => {
        res.setHeader('content-type', 'text/plain');
        res.writeHead(201, 'Made');
      },
      (res) => (res.writeHead as (...args: unknown[]) => ServerResponse)(201, null, { 'content-type': 'text/plain' }),
    ];
    for (const [i, head] of heads.entries()) {
      const served = await serve({
        answer: (res, run) => {
          head(res);
          res.end(`run ${run}`);
        },
      });
      try {
        const first = await served.post(`reason-${i}`);
        expect(first.status).toBe(201);
        expect(first.body.toString()).toBe('run 1');
        const again = await served.post(`reason-${i}`);
        expect(again).toMatchObject({
          status: 201,
          headers: { 'idempotent-replayed': 'true', 'content-type': 'text/plain' },
        });
        expect(again.body.toString()).toBe('run 1');
        expect(served.runs()).toBe(1);
      } finally {
        await served.close();
      }
    }
  });
});

describe('release() on the context', () => {
  it('held: a date the head announced before release() is taken back, since nothing went out yet', async () => {
    const served = await serve({
      hold: true,
      advertiseExpiry: true,
      answer: (res, run, _capture, context) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        if (run === 1) context.release();
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('said-late');
      expect([first.body.toString(), first.headers['idempotency-expires']]).toEqual(['run 1', undefined]);
      const second = await served.post('said-late');
      expect(second.body.toString()).toBe('run 2');
      // Not released, so announced and kept.
      expect(second.headers['idempotency-expires']).toMatch(/ GMT$/);
      expect((await served.post('said-late')).headers['idempotent-replayed']).toBe('true');
    } finally {
      await served.close();
    }
  });

  it('after the response ended, release() changes nothing, held or not: the outcome is stored and replayed', async () => {
    for (const hold of [false, true]) {
      const served = await serve({
        hold,
        answer: (res, run, _capture, context) => {
          res.statusCode = 201;
          res.end(`run ${run}`);
          context.release();
        },
      });
      try {
        expect((await served.post(`late-${hold}`)).body.toString()).toBe('run 1');
        const again = await served.post(`late-${hold}`);
        expect([again.headers['idempotent-replayed'], again.body.toString()], `hold ${hold}`).toEqual([
          'true',
          'run 1',
        ]);
      } finally {
        await served.close();
      }
    }
  });

  it('held: a live feed that said it had no effect is still refused 503 (its events are never held), and released', async () => {
    const served = await serve({
      hold: true,
      answer: (res, _run, _capture, context) => {
        context.release();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: 1\n\n');
        res.end();
      },
    });
    try {
      const first = await served.post('feed');
      expect([first.status, JSON.parse(first.body.toString()).code]).toEqual([503, 'store_unavailable']);
      expect(served.events.map((event) => event.type)).toContain('not-stored');
      expect((await served.post('feed')).status).toBe(503);
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });

  it('release() on any answer, a destroyed one too, says not-stored after the release', async () => {
    const served = await serve({
      answer: (res, _run, _capture, context) => {
        context.release();
        res.destroy();
      },
    });
    try {
      await expect(served.post('gone')).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'not-stored'));
      expect(served.events.map((event) => event.type)).toEqual([
        'claim',
        'response-not-stored',
        'release',
        'not-stored',
      ]);
    } finally {
      await served.close();
    }
  });

  it('release() and keyFor() work taken off the context; release() after the end warns once and changes nothing', async () => {
    const warnings = captureWarnings();
    const keys: string[] = [];
    const served = await serve({
      answer: (res, run, _capture, context) => {
        const { release, keyFor } = context;
        keys.push(keyFor('charge'));
        res.statusCode = 503;
        if (run <= 2) release();
        res.end(`run ${run}`);
        // Too late for runs 3 and 4: their answers are settled (stored) when the response ends.
        if (run >= 3) release();
      },
    });
    try {
      expect((await served.post('detached')).body.toString()).toBe('run 1');
      expect((await served.post('detached')).body.toString()).toBe('run 2');
      expect(served.events.filter((event) => event.type === 'not-stored')).toHaveLength(2);
      expect((await served.post('late')).body.toString()).toBe('run 3');
      const replayed = await served.post('late');
      expect([replayed.headers['idempotent-replayed'], replayed.body.toString()]).toEqual(['true', 'run 3']);
      expect((await served.post('late-too')).body.toString()).toBe('run 4');
      expect(served.runs()).toBe(4);
      // The same downstream key on every run of one request.
      expect(keys[0]).toBe(keys[1]);
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.withCode('IDEM_LATE_RELEASE')).toHaveLength(1);
    } finally {
      warnings.stop();
      await served.close();
    }
  });

  it('held: release() takes back only the date the capture announced, not one the handler set', async () => {
    const served = await serve({
      hold: true,
      advertiseExpiry: true,
      answer: (res, _run, _capture, context) => {
        res.setHeader('idempotency-expires', 'Sun, 06 Nov 1994 08:49:37 GMT');
        res.writeHead(200, { 'content-type': 'text/plain' });
        context.release();
        res.end('mine');
      },
    });
    try {
      expect((await served.post('own-date')).headers['idempotency-expires']).toBe('Sun, 06 Nov 1994 08:49:37 GMT');
    } finally {
      await served.close();
    }
  });

  it('not held: a head that went out before release() keeps its date, and the key is released all the same', async () => {
    const served = await serve({
      advertiseExpiry: true,
      answer: (res, run, _capture, context) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('part ');
        context.release();
        res.end(`run ${run}`);
      },
    });
    try {
      expect((await served.post('said-after-head')).headers['idempotency-expires']).toMatch(/ GMT$/);
      expect((await served.post('said-after-head')).body.toString()).toBe('part run 2');
      expect(served.events.filter((event) => event.type === 'not-stored')).toHaveLength(2);
    } finally {
      await served.close();
    }
  });
});

describe('Idempotency-Expires on an answer that is no outcome', () => {
  // Held, its head waits in the capture, so the date announced at writeHead can still be taken
  // back. (Not held, writeHead commits the head at once in Node: a 404 written so keeps its date.)
  it('held: a 404 no route took, its head written first, announces nothing; a date the handler set itself stays', async () => {
    for (const own of [undefined, 'Sun, 06 Nov 1994 08:49:37 GMT']) {
      const served = await serve({
        hold: true,
        advertiseExpiry: true,
        unrouted: (res) => res.statusCode === 404,
        answer: (res) => {
          if (own !== undefined) res.setHeader('idempotency-expires', own);
          res.writeHead(404, { 'content-type': 'text/plain' });
          res.end('no such route');
        },
      });
      try {
        const answer = await served.post('nowhere');
        expect([answer.status, answer.headers['idempotency-expires']]).toEqual([404, own]);
        expect(served.notStored()).toMatchObject([{ reason: 'no-route' }]);
      } finally {
        await served.close();
      }
    }
  });
});

describe('the bytes a captured response stores', () => {
  it("held: a response over the store's declared cap rolls back and is answered 503, as one over maxResponseBytes; the retry runs", async () => {
    // A 5xx too: under the cap it is served as written and stored, over it nothing can be stored.
    for (const status of [201, 500]) {
      // The store declares a cap it does not enforce itself: only the HTTP layer's check can refuse.
      const store = Object.assign(transactionalMemoryStore(), { maxResponseBytes: 200 });
      const served = await serve({
        store,
        hold: true,
        advertiseExpiry: true,
        answer: (res) => {
          res.statusCode = status;
          res.end('x'.repeat(500));
        },
      });
      try {
        const first = await served.post('capped');
        expect(first.status, String(status)).toBe(503);
        expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable' });
        // The key is released: no date is announced for it.
        expect(first.headers['idempotency-expires']).toBeUndefined();
        expect(served.notStored()).toMatchObject([{ reason: 'too-large', status }]);
        expect(served.events.some((event) => event.type === 'store-error')).toBe(false);
        expect((await served.post('capped')).status).toBe(503);
        expect(served.runs()).toBe(2);
      } finally {
        await served.close();
      }
    }
  });

  it('stores a body of exactly maxResponseBytes, and not one a byte longer (its key keeps what a retry gets instead)', async () => {
    const served = await serve({
      maxResponseBytes: 10,
      answer: (res, run) => {
        res.statusCode = 201;
        res.write('0123456');
        res.end(run === 1 ? '789' : '789!');
      },
    });
    try {
      expect((await served.post('fits')).body.toString()).toBe('0123456789');
      const again = await served.post('fits');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body.toString()).toBe('0123456789');
      expect(served.notStored()).toEqual([]);
      // The second execution writes 11 bytes: served whole and not stored. The operation ran, so
      // the default policy keeps the key, and the retry is told its response cannot be replayed.
      expect((await served.post('over')).body.toString()).toBe('0123456789!');
      expect(served.notStored()).toMatchObject([{ reason: 'too-large', status: 201 }]);
      const retried = await served.post('over');
      expect(retried).toMatchObject({ status: 500, headers: { 'idempotent-replayed': 'true' } });
      expect(JSON.parse(retried.body.toString())).toMatchObject({ code: 'response_not_replayable' });
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });

  it('stores the bytes as written, though the handler reuses its buffer once the write is done', async () => {
    const served = await serve({
      answer: (res) => {
        const buffer = Buffer.from('first part|');
        res.statusCode = 201;
        res.write(buffer, () => {
          // The write is done: the buffer is the handler's again.
          buffer.fill('#');
          res.end('second part');
        });
      },
    });
    try {
      expect((await served.post('reuse')).body.toString()).toBe('first part|second part');
      const again = await served.post('reuse');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body.toString()).toBe('first part|second part');
    } finally {
      await served.close();
    }
  });

  it('takes strings written in another encoding (hex, latin1) as the bytes they encode, with or without a Content-Length', async () => {
    const expected = Buffer.from([0xde, 0xad, 0xbe, 0xef, 0xe9]);
    const answers: Array<(res: ServerResponse) => void> = [
      // Declared length, no end: settled on the last declared byte.
      (res) => {
        res.writeHead(201, { 'content-type': 'application/octet-stream', 'content-length': '5' });
        res.write('dead', 'hex');
        res.write('beef', 'hex');
        res.write('\u00e9', 'latin1');
      },
      // No length: written, then ended with an encoded string.
      (res) => {
        res.writeHead(201, { 'content-type': 'application/octet-stream' });
        res.write('deadbeef', 'hex');
        res.end('6Q==', 'base64');
      },
    ];
    for (const store of [memoryStore(), networkLike()]) {
      for (const [i, answer] of answers.entries()) {
        const served = await serve({ store, answer });
        try {
          const first = await served.post(`enc-${i}`);
          expect(first.status).toBe(201);
          expect(first.body).toEqual(expected);
          const again = await served.post(`enc-${i}`);
          expect(again.headers['idempotent-replayed']).toBe('true');
          expect(again.body).toEqual(expected);
        } finally {
          await served.close();
        }
      }
    }
  });
});

describe('the callbacks a handler passes to write and end', () => {
  // Every form Node takes: write(chunk, cb), write(chunk, encoding, cb), end(cb), end(chunk, cb),
  // end(chunk, encoding, cb). Each answer resolves `called` with the callbacks that ran, in order.
  type Answer = (res: ServerResponse, called: string[], done: () => void) => void;
  const answers: Record<string, Answer> = {
    'write(chunk, cb) + end(cb)': (res, called, done) => {
      res.statusCode = 201;
      res.write('ab', () => called.push('write'));
      res.end(() => {
        called.push('end');
        done();
      });
    },
    'write(chunk, encoding, cb) + end(chunk, cb)': (res, called, done) => {
      res.statusCode = 201;
      res.write('a', 'utf8', () => called.push('write'));
      res.end('b', () => {
        called.push('end');
        done();
      });
    },
    'end(chunk, encoding, cb)': (res, called, done) => {
      res.statusCode = 201;
      res.write('a');
      res.end('62', 'hex', () => {
        called.push('end');
        done();
      });
    },
  };
  for (const hold of [false, true]) {
    for (const [form, answer] of Object.entries(answers)) {
      it(`${hold ? 'held (transactional)' : 'settled'}: ${form} are all called, and the body is whole`, async () => {
        const called: string[] = [];
        let done!: () => void;
        const finished = new Promise<void>((resolve) => {
          done = resolve;
        });
        const served = await serve({ hold, answer: (res) => answer(res, called, done) });
        try {
          const first = await served.post('cb');
          expect(first.status).toBe(201);
          expect(first.body.toString()).toBe('ab');
          await finished;
          expect(called.at(-1)).toBe('end');
          expect(called).toContain(form.startsWith('write') ? 'write' : 'end');
          const again = await served.post('cb');
          expect(again.headers['idempotent-replayed']).toBe('true');
          expect(again.body.toString()).toBe('ab');
        } finally {
          await served.close();
        }
      });
    }
  }

  it("lets a writer that waits for 'drain' end its response when the last declared byte comes alone (that write returns true)", async () => {
    let finished!: () => void;
    const done = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const served = await serve({
      store: networkLike(),
      answer: async (res) => {
        res.writeHead(201, { 'content-type': 'text/plain', 'content-length': '4' });
        res.once('finish', finished);
        for (const chunk of ['abc', 'd']) if (!res.write(chunk)) await once(res, 'drain');
        res.end();
      },
    });
    try {
      expect((await served.post('piped-last')).body.toString()).toBe('abcd');
      await done;
      expect((await served.post('piped-last')).headers['idempotent-replayed']).toBe('true');
    } finally {
      await served.close();
    }
  });

  it('calls the callback of the write that carries the last declared byte, whenever the store answers', async () => {
    for (const store of [memoryStore(), networkLike()]) {
      for (const withEncoding of [false, true]) {
        let called!: () => void;
        const wrote = new Promise<void>((resolve) => {
          called = resolve;
        });
        const served = await serve({
          store,
          answer: (res) => {
            res.writeHead(201, { 'content-type': 'text/plain', 'content-length': '5' });
            res.write('ab');
            if (withEncoding) res.write('cde', 'utf8', called);
            else res.write('cde', called);
          },
        });
        try {
          expect((await served.post(`last-cb-${withEncoding}`)).body.toString()).toBe('abcde');
          await wrote;
          expect((await served.post(`last-cb-${withEncoding}`)).headers['idempotent-replayed']).toBe('true');
        } finally {
          await served.close();
        }
      }
    }
  });
});

describe('a held (transactional) response', () => {
  it('goes out with the status and headers given to writeHead, and is replayed with them', async () => {
    const served = await serve({
      hold: true,
      answer: (res, run) => {
        res.writeHead(201, { 'content-type': 'text/csv', location: '/charges/1' });
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('head');
      expect(first).toMatchObject({ status: 201, headers: { 'content-type': 'text/csv', location: '/charges/1' } });
      expect(first.body.toString()).toBe('run 1');
      const again = await served.post('head');
      expect(again).toMatchObject({
        status: 201,
        headers: { 'content-type': 'text/csv', location: '/charges/1', 'idempotent-replayed': 'true' },
      });
      expect(again.body.toString()).toBe('run 1');
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });

  it('streamed through a pipe goes out whole (held writes never ask the pipe to wait)', async () => {
    const parts = Array.from({ length: 40 }, (_, i) => `part ${i};`);
    const served = await serve({
      hold: true,
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('content-type', 'text/plain');
        Readable.from(parts, { objectMode: false, highWaterMark: 1 }).pipe(res);
      },
    });
    try {
      const first = await served.post('piped');
      expect(first.body.toString()).toBe(parts.join(''));
      expect((await served.post('piped')).body.toString()).toBe(parts.join(''));
    } finally {
      await served.close();
    }
  });

  it("replaced by a 503 when too large to store: none of the handler's headers go out with the problem", async () => {
    const served = await serve({
      hold: true,
      maxResponseBytes: 8,
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('location', '/charges/1');
        res.setHeader('x-handler', 'yes');
        res.end('far more than eight bytes');
      },
    });
    try {
      const first = await served.post('big');
      expect(first.status).toBe(503);
      expect(first.headers['content-type']).toBe('application/problem+json');
      expect(first.headers.location).toBeUndefined();
      expect(first.headers['x-handler']).toBeUndefined();
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable', status: 503 });
      expect(served.notStored()).toMatchObject([{ reason: 'too-large', status: 201 }]);
    } finally {
      await served.close();
    }
  });

  it('of server-sent events without writeHead is never stored: released at once, ended or not', async () => {
    for (const ends of [false, true]) {
      const served = await serve({
        hold: true,
        answer: (res) => {
          res.setHeader('content-type', 'text/event-stream');
          if (ends) res.end('data: 1\n\n');
          else res.write('data: 1\n\n');
        },
      });
      try {
        const first = await served.post(`sse-${ends}`);
        expect(first.status).toBe(503);
        expect(served.notStored()).toMatchObject([{ reason: 'event-stream' }]);
        await waitFor(() => served.events.some((event) => event.type === 'release'));
        expect(served.events.some((event) => event.type === 'complete')).toBe(false);
      } finally {
        await served.close();
      }
    }
  });

  it('keeps the status of its first write, as Node sends it, though the handler changes it before the end', async () => {
    const served = await serve({
      hold: true,
      answer: (res, run) => {
        res.statusCode = 201;
        res.write(`run ${run}`);
        res.statusCode = 500;
        res.end();
      },
    });
    try {
      const first = await served.post('status');
      expect(first.status).toBe(201);
      const again = await served.post('status');
      expect(again).toMatchObject({ status: 201, headers: { 'idempotent-replayed': 'true' } });
      expect(again.body.toString()).toBe('run 1');
    } finally {
      await served.close();
    }
  });

  it('whose client left before the commit is committed all the same (or rolled back), and written nowhere', async () => {
    for (const big of [false, true]) {
      let entered!: () => void;
      const committing = new Promise<void>((resolve) => {
        entered = resolve;
      });
      let open!: () => void;
      const gate = new Promise<void>((resolve) => {
        open = resolve;
      });
      let closed!: () => void;
      const gone = new Promise<void>((resolve) => {
        closed = resolve;
      });
      const errors: unknown[] = [];
      const store = transactionalMemoryStore({
        beforeCommit: async () => {
          entered();
          await gate;
        },
      });
      const served = await serve({
        store,
        hold: true,
        maxResponseBytes: 8,
        answer: (res, run) => {
          res.on('error', (error) => errors.push(error));
          const answer = () => {
            res.statusCode = 201;
            res.end(big ? `run ${run}, too large to store` : `run ${run}`);
          };
          // Too large, it rolls back at once: answered only once its client left.
          res.once('close', () => {
            closed();
            if (big) answer();
          });
          if (big) entered();
          else answer();
        },
      });
      try {
        await expect(served.post('tx-left', '/charges', committing)).rejects.toThrow();
        if (big) {
          await gone;
          await waitFor(() => served.events.some((event) => event.type === 'release'));
          expect(served.notStored()).toMatchObject([{ reason: 'too-large', status: 201 }]);
          expect(errors).toEqual([]);
          continue;
        }
        await gone;
        open();
        await waitFor(() => served.events.some((event) => event.type === 'complete'));
        const again = await served.post('tx-left');
        expect(again).toMatchObject({ status: 201, headers: { 'idempotent-replayed': 'true' } });
        expect(again.body.toString()).toBe('run 1');
        expect(errors).toEqual([]);
      } finally {
        await served.close();
      }
    }
  });

  it('whose client left while it streamed, without an end, releases the key (streaming)', async () => {
    let wrote!: () => void;
    const streaming = new Promise<void>((resolve) => {
      wrote = resolve;
    });
    const served = await serve({
      hold: true,
      answer: (res) => {
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        res.write('chunk 1');
        wrote();
      },
    });
    try {
      await expect(served.post('left', '/charges', streaming)).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      expect(served.notStored()).toMatchObject([{ reason: 'streaming', status: 200 }]);
    } finally {
      await served.close();
    }
  });
});

describe('a response closed before its head', () => {
  it('whose client left while the handler worked, and the handler then returned without an end: released (closed)', async () => {
    let working!: () => void;
    const started = new Promise<void>((resolve) => {
      working = resolve;
    });
    const served = await serve({
      answer: (res, _run, capture) => {
        working();
        // The handler finds its client gone and returns: the framework has nothing to write.
        res.once('close', () => capture.handlerReturned());
      },
    });
    try {
      await expect(served.post('gone', '/charges', started)).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      expect(served.notStored()).toMatchObject([{ reason: 'closed' }]);
    } finally {
      await served.close();
    }
  });

  it('once the handler returned, whose `onClosed` settles nothing: released (closed)', async () => {
    let returned!: () => void;
    const handed = new Promise<void>((resolve) => {
      returned = resolve;
    });
    const contexts: unknown[] = [];
    const served = await serve({
      answer: (_res, _run, capture) => {
        capture.handlerReturned((context, closed) => contexts.push(context, closed === capture), 'ctx');
        returned();
      },
    });
    try {
      await expect(served.post('nothing', '/charges', handed)).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      // Asked with its context and the very capture, to settle it from what the handler left.
      expect(contexts).toEqual(['ctx', true]);
      expect(served.notStored()).toMatchObject([{ reason: 'closed' }]);
    } finally {
      await served.close();
    }
  });

  it('destroyed by the server once the handler returned: `onClosed` is not asked, and the key is released', async () => {
    const contexts: unknown[] = [];
    const served = await serve({
      answer: (res, _run, capture) => {
        capture.handlerReturned((context, closed) => {
          contexts.push(context);
          closed.completeWith({ status: 201, headers: {}, body: Buffer.from('left') });
        }, 'ctx');
        res.destroy();
      },
    });
    try {
      await expect(served.post('destroyed')).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      expect(contexts).toEqual([]);
      expect(served.notStored()).toMatchObject([{ reason: 'closed' }]);
      await expect(served.post('destroyed')).rejects.toThrow();
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });
});

describe('server-sent events', () => {
  it('are recognised whatever the case of the media type, and released at once, once', async () => {
    const served = await serve({
      answer: (res) => {
        res.writeHead(200, { 'Content-Type': 'Text/Event-Stream; charset=utf-8' });
        res.write('data: 1\n\n');
        res.end('data: 2\n\n');
      },
    });
    try {
      expect((await served.post('sse')).body.toString()).toBe('data: 1\n\ndata: 2\n\n');
      expect(served.notStored()).toMatchObject([{ reason: 'event-stream', status: 200 }]);
      expect((await served.post('sse')).headers['idempotent-replayed']).toBeUndefined();
      expect(served.runs()).toBe(2);
      expect(served.events.filter((event) => event.type === 'release')).toHaveLength(2);
    } finally {
      await served.close();
    }
  });

  it('whose client leaves mid-stream are released once, for the event stream', async () => {
    let wrote!: () => void;
    const streaming = new Promise<void>((resolve) => {
      wrote = resolve;
    });
    let closed!: () => void;
    const gone = new Promise<void>((resolve) => {
      closed = resolve;
    });
    const served = await serve({
      answer: (res) => {
        res.once('close', closed);
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: 1\n\n', () => wrote());
      },
    });
    try {
      await expect(served.post('sse-left', '/charges', streaming)).rejects.toThrow();
      // The close after the client left settles nothing more: the stream was released at its head.
      await gone;
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      await new Promise((resolve) => setImmediate(resolve));
      expect(served.notStored()).toMatchObject([{ reason: 'event-stream' }]);
      expect(served.events.filter((event) => event.type === 'release')).toHaveLength(1);
    } finally {
      await served.close();
    }
  });
});

describe('an answer no route took (`unrouted`)', () => {
  it('written with writeHead first, then ended, is served and not stored, held (transactional) or not', async () => {
    // As Express's check reads it (`answeredByNoRoute`): the response's status once it ends.
    for (const hold of [false, true]) {
      const served = await serve({
        hold,
        unrouted: (res) => res.statusCode === 404,
        answer: (res) => {
          res.writeHead(404, { 'content-type': 'text/plain' });
          res.end('no such route');
        },
      });
      try {
        const first = await served.post(`nr-${hold}`, '/nowhere');
        expect(first.status).toBe(404);
        expect(first.body.toString()).toBe('no such route');
        expect(served.notStored()).toMatchObject([{ reason: 'no-route', status: 404 }]);
        const again = await served.post(`nr-${hold}`, '/nowhere');
        expect(again.status).toBe(404);
        expect(again.headers['idempotent-replayed']).toBeUndefined();
        expect(served.runs()).toBe(2);
      } finally {
        await served.close();
      }
    }
  });

  it('with a Content-Length and no end is not stored either: settled on its last byte', async () => {
    const served = await serve({
      unrouted: (res) => res.statusCode === 404,
      answer: (res) => {
        res.writeHead(404, { 'content-type': 'text/plain', 'content-length': '13' });
        res.write('no such ');
        res.write('route');
      },
    });
    try {
      expect((await served.post('nr-cl', '/nowhere')).body.toString()).toBe('no such route');
      expect(served.notStored()).toMatchObject([{ reason: 'no-route', status: 404 }]);
      const again = await served.post('nr-cl', '/nowhere');
      expect(again.headers['idempotent-replayed']).toBeUndefined();
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });

  it('held: a 404 given to writeHead is reported with its status, and the callback of its end is called', async () => {
    let called!: () => void;
    const ended = new Promise<void>((resolve) => {
      called = resolve;
    });
    const served = await serve({
      hold: true,
      unrouted: () => true,
      answer: (res) => {
        res.writeHead(404, { 'content-type': 'text/plain' });
        res.end('no such route', called);
      },
    });
    try {
      const first = await served.post('nr-held', '/nowhere');
      expect(first.status).toBe(404);
      expect(first.body.toString()).toBe('no such route');
      await ended;
      expect(served.notStored()).toMatchObject([{ reason: 'no-route', status: 404 }]);
    } finally {
      await served.close();
    }
  });

  // Held, nothing past maxResponseBytes is kept (see the next describe): a 404 over it cannot go out
  // whole, nor cut short as if it were whole. It gets the 503 of any held answer over the limit; the
  // key is released as for any unrouted answer.
  it('held: a 404 larger than maxResponseBytes, written in pieces, is answered 503, never cut short', async () => {
    const pieces = ['no such route, ', 'and this answer ', 'is longer than the cap'];
    const served = await serve({
      hold: true,
      maxResponseBytes: 16,
      unrouted: (res) => res.statusCode === 404,
      answer: (res) => {
        res.statusCode = 404;
        for (const piece of pieces.slice(0, -1)) res.write(piece);
        res.end(pieces.at(-1));
      },
    });
    try {
      const first = await served.post('nr-big', '/nowhere');
      expect(first.status).toBe(503);
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable', retryable: true });
      expect(served.notStored()).toMatchObject([{ reason: 'no-route', status: 404 }]);
    } finally {
      await served.close();
    }
  });
});

describe('held: a body over maxResponseBytes', () => {
  // Nothing of it can be stored, so the transaction rolls back and the client gets 503: the capture
  // keeps none of it, whatever its size, rather than every byte until then.
  it('keeps no byte past the limit, and frees what it held: 503, the retry runs', async () => {
    const piece = 'x'.repeat(1000);
    let held: number[] = [];
    const served = await serve({
      hold: true,
      maxResponseBytes: 2500,
      answer: (res, _run, capture) => {
        res.statusCode = 201;
        held = [];
        for (let i = 0; i < 5; i++) {
          expect(res.write(piece)).toBe(true);
          held.push(heldBytes(capture));
        }
        res.end(piece);
        held.push(heldBytes(capture));
      },
    });
    try {
      const first = await served.post('big-held');
      expect(first.status).toBe(503);
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable', retryable: true });
      expect(held).toEqual([1000, 2000, 0, 0, 0, 0]);
      expect(served.notStored()).toMatchObject([{ reason: 'too-large', status: 201 }]);
      expect((await served.post('big-held')).status).toBe(503);
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });

  // Its answer cannot be flushed whole any more: the same 503, though the handler said it had no
  // effect, and its key released as that says. Before, every byte was kept for this case alone.
  it('release() after the overflow: the same 503, and the key released', async () => {
    const served = await serve({
      hold: true,
      maxResponseBytes: 10,
      answer: (res, run, _capture, context) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('0123456789');
        res.write('abc');
        context.release();
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('said-over');
      expect(first.status).toBe(503);
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable', retryable: true });
      expect(first.headers['content-type']).toBe('application/problem+json');
      const again = await served.post('said-over');
      expect([again.status, again.headers['idempotent-replayed']]).toEqual([503, undefined]);
      expect(served.runs()).toBe(2);
      expect(served.events.filter((event) => event.type === 'not-stored')).toHaveLength(2);
    } finally {
      await served.close();
    }
  });

  it('release() before the body went over it: the same 503', async () => {
    const served = await serve({
      hold: true,
      maxResponseBytes: 10,
      answer: (res, _run, _capture, context) => {
        context.release();
        res.statusCode = 200;
        res.write('0123456789');
        res.end('abc');
      },
    });
    try {
      const first = await served.post('said-before');
      expect(first.status).toBe(503);
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable' });
    } finally {
      await served.close();
    }
  });

  it('release() with a body of exactly the limit: served as written, nothing was dropped', async () => {
    const served = await serve({
      hold: true,
      maxResponseBytes: 10,
      answer: (res, run, _capture, context) => {
        context.release();
        res.statusCode = 200;
        res.write('01234');
        res.end(run === 1 ? '56789' : 'run 2');
      },
    });
    try {
      expect((await served.post('said-fits')).body.toString()).toBe('0123456789');
      expect((await served.post('said-fits')).body.toString()).toBe('01234run 2');
    } finally {
      await served.close();
    }
  });
});

describe('the key echo (`echo`)', () => {
  it('is not put back, and nothing throws, on a response whose head already went out', async () => {
    const served = await serve({
      echo: true,
      answer: (res, run) => {
        res.removeHeader('idempotency-key');
        res.writeHead(201, { 'content-type': 'text/plain' });
        res.end(`run ${run}`);
      },
    });
    try {
      const first = await served.post('echo-late');
      expect(first.status).toBe(201);
      expect(first.body.toString()).toBe('run 1');
      expect((await served.post('echo-late')).headers['idempotent-replayed']).toBe('true');
    } finally {
      await served.close();
    }
  });
});

describe('the capture, as an adapter drives it', () => {
  it('says `ended` once the response ended, by `end` or by its last declared byte', async () => {
    const seen: boolean[] = [];
    const served = await serve({
      answer: (res, run, capture) => {
        seen.push(capture.ended);
        if (run === 1) {
          res.statusCode = 201;
          res.write('a');
          seen.push(capture.ended);
          res.end('b');
        } else {
          res.writeHead(201, { 'content-length': '2' });
          res.write('a');
          seen.push(capture.ended);
          res.write('b');
        }
        seen.push(capture.ended);
      },
    });
    try {
      expect((await served.post('ended-1')).body.toString()).toBe('ab');
      expect((await served.post('ended-2')).body.toString()).toBe('ab');
      expect(seen).toEqual([false, false, true, false, false, true]);
    } finally {
      await served.close();
    }
  });

  it('ignores `completeWith` and `abandon` once the last declared byte is written: the end still follows that byte', async () => {
    for (const late of ['completeWith', 'abandon'] as const) {
      const endReturned: unknown[] = [];
      const served = await serve({
        store: networkLike(),
        answer: (res, run, capture) => {
          res.writeHead(201, { 'content-type': 'text/plain', 'content-length': '6' });
          res.write(`run ${run}!`);
          if (late === 'completeWith') capture.completeWith({ status: 500, headers: {}, body: Buffer.from('no') });
          else capture.abandon(500);
          // While the store has not answered, the last byte is held: the end must not overtake it.
          endReturned.push(res.end() === res);
        },
      });
      try {
        expect((await served.post(`late-${late}`)).body.toString()).toBe('run 1!');
        const again = await served.post(`late-${late}`);
        expect(again).toMatchObject({ status: 201, headers: { 'idempotent-replayed': 'true' } });
        expect(again.body.toString()).toBe('run 1!');
        expect(served.notStored()).toEqual([]);
        expect(endReturned).toEqual([true]);
      } finally {
        await served.close();
      }
    }
  });

  it("`abandon` without a reason gives up the response as a stream the framework will not finish ('streaming')", async () => {
    const served = await serve({
      answer: (res, run, capture) => {
        capture.abandon(200);
        res.end(`run ${run}`);
      },
    });
    try {
      expect((await served.post('abandoned')).body.toString()).toBe('run 1');
      expect(served.notStored()).toMatchObject([{ reason: 'streaming', status: 200 }]);
      const retried = await served.post('abandoned');
      expect(retried).toMatchObject({ status: 500, headers: { 'idempotent-replayed': 'true' } });
      expect(JSON.parse(retried.body.toString())).toMatchObject({ code: 'response_not_replayable' });
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });

  it("`completeWith` after a body parser's refusal (`failedWith` true) stores nothing and frees the key", async () => {
    const refusal = Object.assign(new Error('Unexpected token'), { status: 400, type: 'entity.parse.failed' });
    const answers: boolean[] = [];
    const served = await serve({
      answer: (res, _run, capture) => {
        answers.push(capture.failedWith(new Error('a handler failure')), capture.failedWith(refusal));
        // As Koa does when its client left: the answer it would have written, from the context.
        capture.completeWith({ status: 400, headers: { 'content-type': 'text/plain' }, body: Buffer.from('Bad') });
        res.destroy();
      },
    });
    try {
      await expect(served.post('refused')).rejects.toThrow();
      await waitFor(() => served.events.some((event) => event.type === 'release'));
      expect(answers).toEqual([false, true]);
      expect(served.notStored()).toMatchObject([{ reason: 'body-refused', status: 400 }]);
    } finally {
      await served.close();
    }
  });
});
