import type { ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { networkLike, type ServeOptions, serve } from './capture-server.js';

// The first execution's answer is one caller's result, as its replay is: a shared cache in front of
// a POST route (nginx with `proxy_cache_methods POST`) must not keep it for the next caller. The
// capture says `Cache-Control: no-store` on every head it lets out, unless the handler set its own,
// and the record it stores is what it was: Cache-Control is never replayed. Each way a head can
// leave is one case: Node writes an implicit head through whichever `writeHead` is on the response
// at that moment, the capture's or, once its wrappers are restored, Node's own.

const body = '{"id":"ch_1"}';

// One first execution written by `answer`, then its replay: the headers of both, and the body.
async function firstAndReplay(answer: ServeOptions['answer'], options: Partial<ServeOptions> = {}) {
  const served = await serve({ ...options, answer });
  try {
    const first = await served.post('cc-1');
    const again = await served.post('cc-1');
    return { first, again, runs: served.runs() };
  } finally {
    await served.close();
  }
}

// Each way a handler writes its head without saying anything of caches.
const silentHeads: Record<string, (res: ServerResponse) => void> = {
  // Express's res.send, Koa's respond: the head leaves with `end`, through Node's own writeHead.
  'one end': (res) => {
    res.statusCode = 201;
    res.end(body);
  },
  'writeHead, then end': (res) => {
    res.writeHead(201, { 'content-type': 'application/json' }).end(body);
  },
  // A piped stream: the head leaves with the first write, through the capture's writeHead.
  'writes, then end': (res) => {
    res.statusCode = 201;
    res.write(body.slice(0, 5));
    res.end(body.slice(5));
  },
  // The only write is the last declared byte: settled there, and written once the wrappers are
  // restored, so the head leaves through Node's own writeHead (see writeLast).
  'one write of every declared byte, no end': (res) => {
    res.statusCode = 201;
    res.setHeader('content-length', Buffer.byteLength(body));
    res.write(body);
  },
};

describe('the Cache-Control of a captured response', () => {
  for (const [how, write] of Object.entries(silentHeads)) {
    for (const [storeName, store] of [
      ['memoryStore', undefined],
      ['a store that answers later', networkLike],
    ] as const) {
      it(`no-store on the first execution's head (${how}, ${storeName}); the replay is as it was`, async () => {
        const { first, again, runs } = await firstAndReplay((res) => write(res), {
          ...(store === undefined ? {} : { store: store() }),
        });
        expect(first.status).toBe(201);
        expect(first.headers['cache-control']).toBe('no-store');
        expect(first.body.toString()).toBe(body);
        // Sent once: the head is marked once, whichever path it left by.
        expect(first.raw.filter((name) => name.toLowerCase() === 'cache-control')).toHaveLength(1);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(again.headers['cache-control']).toBe('no-store');
        expect(again.body.toString()).toBe(body);
        expect(runs).toBe(1);
      });
    }
  }

  it('held (transactional), the flushed head says no-store too', async () => {
    for (const write of Object.values(silentHeads).slice(0, 3)) {
      const { first, again } = await firstAndReplay((res) => write(res), { hold: true });
      expect(first.status).toBe(201);
      expect(first.headers['cache-control']).toBe('no-store');
      expect(again.headers['cache-control']).toBe('no-store');
    }
  });

  it("keeps the handler's own Cache-Control, set on the response or passed to writeHead (an object or a flat list), and stores none", async () => {
    const own = 'public, max-age=60';
    const writes: ((res: ServerResponse) => void)[] = [
      (res) => {
        res.statusCode = 201;
        res.setHeader('Cache-Control', own);
        res.end(body);
      },
      (res) => {
        res.writeHead(201, { 'Cache-Control': own }).end(body);
      },
      (res) => {
        res.writeHead(201, ['Cache-Control', own]).end(body);
      },
    ];
    for (const hold of [false, true]) {
      for (const write of writes) {
        const { first, again } = await firstAndReplay((res) => write(res), { hold });
        expect(first.headers['cache-control'], `hold: ${hold}`).toBe(own);
        expect(first.raw.filter((name) => name.toLowerCase() === 'cache-control')).toHaveLength(1);
        // Never replayed: the replay's is its own, as before.
        expect(again.headers['cache-control']).toBe('no-store');
      }
    }
  });

  it('held, a Cache-Control the handler sets after its writeHead (nothing has gone out) is the one sent', async () => {
    const { first } = await firstAndReplay(
      (res) => {
        res.writeHead(201);
        res.setHeader('cache-control', 'private, max-age=5');
        res.end(body);
      },
      { hold: true },
    );
    expect(first.headers['cache-control']).toBe('private, max-age=5');
  });
});
