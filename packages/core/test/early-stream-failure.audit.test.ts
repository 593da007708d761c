// A response the server destroys before any byte of its head left, told apart by the capture
// (plain node:http, the layer mounted as an adapter mounts it). The project's rule: a handler that
// ran never runs again for the same key. A body stream that fails before its first chunk (the
// handler ran and handed its body over; `stream.pipeline` destroys the response with the stream's
// error) is kept as a stream cut short, `500 response_not_replayable`; so is one the handler
// destroys with an error, or after piping a body into it. Destroyed without a word and without a
// body, it is no answer: released (`closed`), as before. A client that leaves is neither: what its
// handler answers after the close is stored, unless a body stream piped into the response was still
// waiting for its first chunk, which nothing will end: kept then as a stream cut short too.

import type { ServerResponse } from 'node:http';
import { pipeline, Readable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { type Served, serve, waitFor } from './capture-server.js';

const served: Served[] = [];
afterEach(async () => {
  while (served.length > 0) await served.pop()?.close();
});

// A body source that fails on its first read, as a read stream of a missing file does.
const failing = () =>
  new Readable({
    read() {
      this.destroy(Object.assign(new Error('ENOENT (injected)'), { code: 'ENOENT' }));
    },
  });

const destroys: Array<[string, (res: ServerResponse) => void, 'kept' | 'released']> = [
  ['stream.pipeline(failing, res)', (res) => pipeline(failing(), res, () => undefined), 'kept'],
  ['res.destroy(error)', (res) => res.destroy(new Error('gave up')), 'kept'],
  [
    'res.destroy() once the failing body was piped',
    (res) => {
      const source = failing();
      source.on('error', () => res.destroy());
      source.pipe(res);
    },
    'kept',
  ],
  ['res.destroy() with no body handed over', (res) => res.destroy(), 'released'],
];

describe('a response destroyed by the server before its head', () => {
  for (const [how, destroy, outcome] of destroys) {
    it(`${how}: ${outcome === 'kept' ? 'the key is kept, the retry gets 500 response_not_replayable' : 'the key is released, the retry runs'}`, async () => {
      const server = await serve({
        // An hour: only an outcome settled at once answers the retry within the test.
        lease: '1h',
        answer: (res, run) => {
          res.statusCode = 201;
          res.setHeader('content-type', 'application/octet-stream');
          if (run === 1) destroy(res);
          else res.end('second run');
        },
      });
      served.push(server);
      await expect(server.post('early-1')).rejects.toThrow();
      await waitFor(() => server.events.some((event) => event.type === 'complete' || event.type === 'release'));
      expect(server.notStored()).toMatchObject([{ reason: outcome === 'kept' ? 'streaming' : 'closed', status: 201 }]);
      const retry = await server.post('early-1');
      if (outcome === 'kept') {
        expect(retry.status).toBe(500);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(JSON.parse(retry.body.toString())).toMatchObject({ code: 'response_not_replayable' });
        expect(server.runs()).toBe(1);
      } else {
        expect(retry.status).toBe(201);
        expect(retry.body.toString()).toBe('second run');
        expect(server.runs()).toBe(2);
      }
    });
  }

  it('a client that leaves before the head is not taken for a destroy by the server: the answer its handler then gives is stored', async () => {
    // Its close destroys the response without an error (and a pipeline into it afterwards finds it
    // destroyed already): the capture waits for the handler, which answers whole after the close.
    let left!: () => void;
    const leave = new Promise<void>((resolve) => {
      left = resolve;
    });
    const server = await serve({
      lease: '1h',
      answer: (res, run) => {
        res.statusCode = 201;
        if (run > 1) return void res.end('second run');
        left();
        res.once('close', () => res.end('first run'));
      },
    });
    served.push(server);
    await expect(server.post('early-2', '/charges', leave)).rejects.toThrow();
    await waitFor(() => server.events.some((event) => event.type === 'complete' || event.type === 'release'));
    expect(server.notStored()).toEqual([]);
    const retry = await server.post('early-2');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body.toString()).toBe('first run');
    expect(server.runs()).toBe(1);
  });

  // A client that leaves before the head while the handler's body stream is piped into the response
  // but has not produced its first chunk (a slow upstream). `stream.pipeline` then fails with a
  // premature close and destroys the source, `source.pipe(res)` unpipes it: no write ever reaches
  // the capture, and nothing would end the response, so waited for, the key would stay in progress,
  // renewed by the heartbeat, and every retry get 409 for as long as the process lives. The handler
  // ran and handed its body over: settled at the close as a stream cut short (kept, `500
  // response_not_replayable`); held (transactional), rolled back and released.
  const livePipes: Array<[string, (res: ServerResponse, source: Readable, failed: () => void) => void]> = [
    ['stream.pipeline(source, res)', (res, source, failed) => pipeline(source, res, failed)],
    [
      'source.pipe(res)',
      (res, source, failed) => {
        res.once('close', failed);
        source.pipe(res);
      },
    ],
  ];
  for (const [index, [how, pipeInto]] of livePipes.entries()) {
    for (const hold of [false, true]) {
      it(`a client that leaves before the first chunk of a piped body stream (${how}${hold ? ', held' : ''}): the key is ${hold ? 'released with the rollback' : 'kept as a stream cut short'}, not left in progress`, async () => {
        let left!: () => void;
        const leave = new Promise<void>((resolve) => {
          left = resolve;
        });
        let failed = false;
        const server = await serve({
          lease: '1h',
          hold,
          answer: (res, run) => {
            res.statusCode = 201;
            if (run > 1) return void res.end('second run');
            // A source whose data has not arrived yet.
            pipeInto(res, new Readable({ read() {} }), () => {
              failed = true;
            });
            left();
          },
        });
        served.push(server);
        await expect(server.post(`early-3-${index}-${hold}`, '/charges', leave)).rejects.toThrow();
        // The server saw the client go: the retry comes after that.
        await waitFor(() => failed);
        await waitFor(() => server.events.some((event) => event.type === 'complete' || event.type === 'release'));
        expect(server.notStored()).toMatchObject([{ reason: 'streaming', status: 201 }]);
        const retry = await server.post(`early-3-${index}-${hold}`);
        if (hold) {
          expect(retry.status).toBe(201);
          expect(retry.body.toString()).toBe('second run');
          expect(server.runs()).toBe(2);
        } else {
          expect(retry.status).toBe(500);
          expect(retry.headers['idempotent-replayed']).toBe('true');
          expect(JSON.parse(retry.body.toString())).toMatchObject({ code: 'response_not_replayable' });
          expect(server.runs()).toBe(1);
        }
      });
    }
  }

  it('a client that leaves after the piped source failed: the whole answer the handler then gives is stored', async () => {
    // The source is dead at the close (a missing file): the pipe is over, so the handler's own
    // answer, given after the close, is the outcome.
    let left!: () => void;
    const leave = new Promise<void>((resolve) => {
      left = resolve;
    });
    const server = await serve({
      lease: '1h',
      answer: (res, run) => {
        res.statusCode = 201;
        if (run > 1) return void res.end('second run');
        const source = failing();
        source.once('error', () => {
          res.once('close', () => res.end('built instead'));
          left();
        });
        source.pipe(res);
      },
    });
    served.push(server);
    await expect(server.post('early-4', '/charges', leave)).rejects.toThrow();
    await waitFor(() => server.events.some((event) => event.type === 'complete' || event.type === 'release'));
    expect(server.notStored()).toEqual([]);
    const retry = await server.post('early-4');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body.toString()).toBe('built instead');
    expect(server.runs()).toBe(1);
  });
});
