// The HTTP layer's recent changes (advertiseExpiry, transactional mode's store cap, release() on the
// context, the lease marks): behaviours that mutation testing of packages/core/src/http-*.ts and
// engine.ts showed no test held.
import type { ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { HttpIdempotencyOptions } from '../src/http-options.js';
import type { IdempotencyContext, ResponseCapture } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';
import type { Outcome } from '../src/outcome-policy.js';
import { type Served, serve } from './capture-server.js';
import { captureWarnings } from './support/warnings.js';

const at = Date.UTC(2026, 10, 22, 9, 30, 15);
const httpDate = (ms: number) => new Date(ms).toUTCString();
const HOUR = 3_600_000;

// The capture server (capture-server.ts) taking any option of the layer, with the answer's
// arguments in this file's order. `transactional`: held, the handler in the store's transaction.
function layer(
  options: Partial<HttpIdempotencyOptions<unknown>>,
  answer: (res: ServerResponse, run: number, context: IdempotencyContext, capture: ResponseCapture) => void,
): Promise<Served> {
  return serve({
    hold: options.transactional === true,
    layer: options,
    answer: (res, run, capture, context) => answer(res, run, context, capture),
  });
}

describe('advertiseExpiry: the date follows the outcome policy', () => {
  it("'success': a 201 announces its retention, a 500 (released) nothing, and the 500's retry runs", async () => {
    // The preset judges an outcome that did not throw: asked as if thrown, 'success' would keep nothing.
    const served = await layer({ storeOutcome: 'success', advertiseExpiry: true, now: () => at }, (res, run) => {
      res.statusCode = run === 1 ? 500 : 201;
      res.end(`run ${run}`);
    });
    try {
      const failed = await served.post('k');
      expect([failed.status, failed.headers['idempotency-expires']]).toEqual([500, undefined]);
      const ran = await served.post('k');
      expect([ran.status, ran.headers['idempotency-expires']]).toEqual([201, httpDate(at + 24 * HOUR)]);
      const again = await served.post('k');
      expect([again.headers['idempotent-replayed'], again.headers['idempotency-expires']]).toEqual([
        'true',
        httpDate(at + 24 * HOUR),
      ]);
      expect(served.runs()).toBe(2);
    } finally {
      await served.close();
    }
  });

  it('a policy function that keeps only what did not throw: an answer announces the date, judged as not thrown', async () => {
    const storeOutcome = ({ thrown }: Outcome) => thrown !== true;
    const served = await layer({ storeOutcome, advertiseExpiry: true, now: () => at }, (res, run) => {
      res.statusCode = 201;
      res.end(`run ${run}`);
    });
    try {
      expect((await served.post('k')).headers['idempotency-expires']).toBe(httpDate(at + 24 * HOUR));
      expect((await served.post('k')).headers['idempotent-replayed']).toBe('true');
    } finally {
      await served.close();
    }
  });

  it('a policy function that throws: the outcome is stored with the default retention, and that date is announced', async () => {
    const storeOutcome = () => {
      throw new Error('policy bug');
    };
    const served = await layer({ storeOutcome, advertiseExpiry: true, now: () => at, retention: '48h' }, (res, run) => {
      res.statusCode = 201;
      res.end(`run ${run}`);
    });
    try {
      const first = await served.post('k');
      expect(first.headers['idempotency-expires']).toBe(httpDate(at + 48 * HOUR));
      const again = await served.post('k');
      expect([again.headers['idempotent-replayed'], again.headers['idempotency-expires']]).toEqual([
        'true',
        httpDate(at + 48 * HOUR),
      ]);
      expect(served.events.some((event) => event.type === 'policy-error')).toBe(true);
    } finally {
      await served.close();
    }
  });

  it("over the store's own cap (not held): the retries' response_not_replayable carries the date the head announced", async () => {
    // Under maxResponseBytes, so the capture keeps it; over what the store declares it takes.
    const store = Object.assign(memoryStore(), { maxResponseBytes: 1000 });
    const served = await layer({ store, advertiseExpiry: true, now: () => at }, (res, run) => {
      res.statusCode = 201;
      res.end(`${run}`.repeat(1500));
    });
    try {
      const first = await served.post('k');
      expect([first.status, first.body.length]).toEqual([201, 1500]);
      expect(first.headers['idempotency-expires']).toBe(httpDate(at + 24 * HOUR));
      const again = await served.post('k');
      expect(again.status).toBe(500);
      expect(JSON.parse(again.body.toString()).code).toBe('response_not_replayable');
      expect(again.headers['idempotency-expires']).toBe(first.headers['idempotency-expires']);
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });
});

describe('transactional mode and advertiseExpiry', () => {
  it('a 500 under the cap, which the policy stores: rolled back, served as written with its date, and replayed with it', async () => {
    // Only a handler that said it had no effect takes the date back; a stored 5xx keeps it.
    const served = await layer({ transactional: true, advertiseExpiry: true, now: () => at }, (res, run) => {
      res.statusCode = 500;
      res.end(`run ${run}`);
    });
    try {
      const first = await served.post('k');
      expect([first.status, first.body.toString()]).toEqual([500, 'run 1']);
      expect(first.headers['idempotency-expires']).toBe(httpDate(at + 24 * HOUR));
      const again = await served.post('k');
      expect([again.headers['idempotent-replayed'], again.headers['idempotency-expires']]).toEqual([
        'true',
        httpDate(at + 24 * HOUR),
      ]);
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });
});

describe('Idempotency-Expires on an answer that is no outcome, not held', () => {
  it('a 404 no route took, its head written first: the head went out with its date, which stays; the key is released', async () => {
    // Not held, writeHead commits the head at once: the date cannot be taken back, and trying to
    // would throw (ERR_HTTP_HEADERS_SENT) in the middle of the end.
    const served = await serve({
      advertiseExpiry: true,
      unrouted: (res) => res.statusCode === 404,
      answer: (res, run) => {
        res.writeHead(404, { 'content-type': 'text/plain' });
        res.end(`no such route ${run}`);
      },
    });
    try {
      const first = await served.post('nowhere');
      expect([first.status, first.body.toString()]).toEqual([404, 'no such route 1']);
      expect(first.headers['idempotency-expires']).toMatch(/ GMT$/);
      expect(served.notStored()).toMatchObject([{ reason: 'no-route' }]);
      expect((await served.post('nowhere')).body.toString()).toBe('no such route 2');
    } finally {
      await served.close();
    }
  });
});

describe('release() on the context', () => {
  it('called before the response ends, it warns nothing (IDEM_LATE_RELEASE is for a late one only)', async () => {
    const warnings = captureWarnings();
    const served = await layer({}, (res, run, context) => {
      context.release();
      res.statusCode = 503;
      res.end(`run ${run}`);
    });
    try {
      expect((await served.post('k')).body.toString()).toBe('run 1');
      expect((await served.post('k')).body.toString()).toBe('run 2');
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.withCode('IDEM_LATE_RELEASE')).toEqual([]);
    } finally {
      warnings.stop();
      await served.close();
    }
  });

  it('called twice before the end, in either mode: the key is still released (saying it again takes nothing back)', async () => {
    for (const transactional of [false, true]) {
      const served = await layer({ transactional }, (res, run, context) => {
        context.release();
        context.release();
        res.statusCode = 503;
        res.end(`run ${run}`);
      });
      try {
        expect((await served.post('k')).body.toString()).toBe('run 1');
        const retry = await served.post('k');
        expect([retry.headers['idempotent-replayed'], retry.body.toString()], `transactional ${transactional}`).toEqual(
          [undefined, 'run 2'],
        );
      } finally {
        await served.close();
      }
    }
  });

  it('called before the end and again after it: released, and the late call still warns', async () => {
    const warnings = captureWarnings();
    const served = await layer({}, (res, run, context) => {
      context.release();
      res.statusCode = 503;
      res.end(`run ${run}`);
      context.release();
    });
    try {
      expect((await served.post('k')).body.toString()).toBe('run 1');
      expect((await served.post('k')).body.toString()).toBe('run 2');
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.withCode('IDEM_LATE_RELEASE')).toHaveLength(1);
    } finally {
      warnings.stop();
      await served.close();
    }
  });
});

describe('the replayCache option', () => {
  it('refuses what is no object, naming the shape it takes, rather than failing on a missing ttl', () => {
    for (const bad of [true, 'yes', null, 1]) {
      expect(() => createIdempotency({ store: memoryStore(), replayCache: bad as never }), String(bad)).toThrow(
        new TypeError('replayCache must be { ttl, entries? } or false'),
      );
    }
  });
});
