// Audit of the capture's "answered for a running handler" path, under the adapters: an answer that
// someone else writes while the handler still runs (a timeout's 503) is never the key's outcome. Over
// node:http with the HTTP layer mounted as an adapter mounts it, on the memory store and on one that
// answers a few turns later, as a store over a network does.
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { IdempotencyEvent } from '../src/events.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { ResponseCapture, RunningHandler } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';
import type { OutcomePolicy } from '../src/outcome-policy.js';
import type { Store } from '../src/store.js';
import { networkLike, post, waitFor } from './capture-server.js';

interface Run {
  res: ServerResponse;
  capture: ResponseCapture;
  handler: RunningHandler & { thrown: boolean; writes: boolean };
}

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const close of closers.splice(0)) await close();
});

// Every first execution is handed to the test (`runs`), which writes and settles it as it likes.
async function serve(store: Store, storeOutcome: OutcomePolicy = 'all') {
  const events: IdempotencyEvent[] = [];
  const runs: Run[] = [];
  const http = createHttpIdempotency({
    store,
    scope: () => 'caller',
    storeOutcome,
    advertiseExpiry: true,
    onEvent: (e) => events.push(e),
  });
  const server = createServer(async (req, res) => {
    const started = await http.begin({
      method: 'POST',
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: undefined,
      keyHeader: http.keyHeader(req),
      body: undefined,
      scope: 'caller',
    });
    if (started.kind !== 'execute') {
      if (started.kind === 'respond') {
        res.writeHead(started.response.status, started.response.headers);
        res.end(started.response.body);
      } else res.end();
      return;
    }
    res.setHeader('idempotency-key', started.echo);
    const handler = {
      running: true,
      thrown: false,
      writes: false,
      writesItself(this: { writes: boolean }) {
        return this.writes;
      },
    };
    const capture = http.capture(res, { settle: { lease: started.lease, thrown: () => handler.thrown }, handler });
    runs.push({ res, capture, handler });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return { post: (key: string) => post(base, '/charges', key), runs, events };
}

// The timeout's answer: a head with its length, then the body by write() (the last declared byte
// settles a response, as end() does), then end().
function timeoutAnswer(res: ServerResponse) {
  const body = '{"error":"timeout"}';
  res.writeHead(503, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.write(body);
  res.end();
}

function settled(run: Run, thrown = false) {
  run.handler.running = false;
  run.handler.thrown = thrown;
  run.capture.handlerSettled();
}

describe.each([
  ['memory', () => memoryStore()],
  ['a store that answers later', () => networkLike()],
] as const)('answered for a running handler, on %s', (_name, store) => {
  it.each(['all', 'success', 'stripe'] as const)(
    "storeOutcome '%s': the 503 goes out at once, unstored; 409 while the handler runs; then the replayed 500 response_not_replayable",
    async (policy) => {
      const app = await serve(store(), policy);
      const first = app.post('k');
      await waitFor(() => app.runs.length === 1);
      const run = app.runs[0] as Run;
      timeoutAnswer(run.res);
      const answered = await first;
      expect(answered.status).toBe(503);
      expect(answered.headers['idempotency-expires']).toBeUndefined();
      expect((await app.post('k')).status).toBe(409);
      settled(run);
      await waitFor(() => app.events.some((event) => event.type === 'complete'));
      const retry = await app.post('k');
      expect(retry.status).toBe(500);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body.toString())).toMatchObject({ code: 'response_not_replayable' });
      expect(app.runs).toHaveLength(1);
      expect(app.events.find((event) => event.type === 'response-not-stored')).toMatchObject({
        reason: 'answered-early',
        status: 503,
      });
    },
  );

  it("a handler that then threw, under 'stripe': released only once it settled", async () => {
    const app = await serve(store(), 'stripe');
    const first = app.post('k');
    await waitFor(() => app.runs.length === 1);
    const run = app.runs[0] as Run;
    timeoutAnswer(run.res);
    expect((await first).status).toBe(503);
    expect((await app.post('k')).status).toBe(409);
    settled(run, true);
    await waitFor(() => app.events.some((event) => event.type === 'release'));
    const retry = app.post('k');
    await waitFor(() => app.runs.length === 2);
    (app.runs[1] as Run).res.writeHead(201).end('{}');
    expect((await retry).status).toBe(201);
  });

  it("a handler that then threw, under 'all': still kept", async () => {
    const app = await serve(store(), 'all');
    const first = app.post('k');
    await waitFor(() => app.runs.length === 1);
    const run = app.runs[0] as Run;
    timeoutAnswer(run.res);
    await first;
    settled(run, true);
    await waitFor(() => app.events.some((event) => event.type === 'complete'));
    expect((await app.post('k')).status).toBe(500);
    expect(app.runs).toHaveLength(1);
  });

  it('an end the handler writes itself (writesItself) while it runs is its outcome: stored, announced with its expiry, and replayed', async () => {
    const app = await serve(store(), 'all');
    const first = app.post('k');
    await waitFor(() => app.runs.length === 1);
    const run = app.runs[0] as Run;
    run.handler.writes = true;
    run.res.writeHead(201, { 'content-type': 'application/json' }).end('{"id":"ch_1"}');
    const answered = await first;
    expect(answered.status).toBe(201);
    // The handler's own answer: its expiry is announced as for any outcome.
    expect(answered.headers['idempotency-expires']).toBeDefined();
    const retry = await app.post('k');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    settled(run);
    expect(app.runs).toHaveLength(1);
  });

  it('an end after the handler settled is its outcome, replayed; answeredForHandler() after the end changes nothing', async () => {
    const app = await serve(store(), 'all');
    const first = app.post('k');
    await waitFor(() => app.runs.length === 1);
    const run = app.runs[0] as Run;
    settled(run);
    run.res.writeHead(201).end('{"id":"ch_1"}');
    run.capture.answeredForHandler();
    expect((await first).status).toBe(201);
    const retry = await app.post('k');
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
  });
});

// Was wrong: a key kept for an answer written while its handler ran took the default retention (24 h)
// whatever the policy function gave the operation: with payments kept 7 days, a retry on day 2 ran
// the payment again. It is now kept at least as long as the policy keeps a success of the operation.
describe('answered for a running handler, with a policy function that keeps the operation longer', () => {
  it('the kept key lasts as long as a success of the operation would, not the default retention', async () => {
    let t = 1_700_000_000_000;
    const store = memoryStore({ now: () => t });
    const week: OutcomePolicy = ({ operation }) => ({
      store: true,
      retention: operation === 'POST /charges' ? '7d' : '1h',
    });
    const app = await serve(store, week);
    const first = app.post('k');
    await waitFor(() => app.runs.length === 1);
    const run = app.runs[0] as Run;
    timeoutAnswer(run.res);
    expect((await first).status).toBe(503);
    settled(run);
    await waitFor(() => app.events.some((event) => event.type === 'complete'));
    t += 2 * 24 * 3_600_000;
    const retry = await app.post('k');
    expect(retry.status).toBe(500);
    expect(JSON.parse(retry.body.toString())).toMatchObject({ code: 'response_not_replayable' });
    expect(app.runs).toHaveLength(1);
  });
});
