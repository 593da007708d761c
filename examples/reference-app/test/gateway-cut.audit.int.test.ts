// Exactly-once through the reference app's gateway under connections cut at byte offsets: between
// the client and the gateway, and between the gateway and the API (a second gateway whose link to
// the API runs through a cutting proxy). After each cut, the same keyed POST /charges is retried
// through the intact gateway. What must hold: one charge row per key, the retry gets 201 (the
// stored one, replayed, when the first run happened) after at most a few clean 409s, never a 422
// or a 5xx; and a cut upstream is answered at once with DESIGN's 502/504 problem+json (or, once the
// API's 201 head went through, by closing the client's connection before the announced length).
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type CutHow, type CutStack, chargeBytes, pause, type RawAnswer, sendRaw, startCutStack } from './cut-stack.js';

let s: CutStack;
let token: string;
let cutGatewayPort: number;
/** Bytes of the API's 201 to a charge through the cutting proxy: its head (with CRLFCRLF) and in all. */
let apiAnswer: { headEnd: number; total: number };
/** Bytes of the gateway's request to the API: its head and in all. */
let apiRequest: { headEnd: number; total: number };
/** Bytes of the gateway's own 201 to a first charge (Connection: close). */
let gatewayAnswer: { headEnd: number; total: number };

beforeAll(async () => {
  s = await startCutStack('gwcut');
  token = await s.token();
  cutGatewayPort = Number(new URL(s.cutGateway.url).port);
  const { bytes } = chargeBytes(token, randomUUID(), body(0));
  const probe = await sendRaw(cutGatewayPort, bytes);
  expect(probe.status).toBe(201);
  const answer = s.upstreamProxy.last.responseBytes;
  apiAnswer = { headEnd: answer.indexOf('\r\n\r\n') + 4, total: answer.length };
  const request = s.upstreamProxy.last.requestBytes;
  apiRequest = { headEnd: request.indexOf('\r\n\r\n') + 4, total: request.length };
  const front = await sendRaw(s.frontProxy.port, chargeBytes(token, randomUUID(), body(0)).bytes);
  expect(front.status).toBe(201);
  gatewayAnswer = { headEnd: front.raw.indexOf('\r\n\r\n') + 4, total: front.raw.length };
}, 60_000);
afterAll(async () => {
  await s?.close();
});

// One amount per key (any body works: each key gets its own).
const body = (n: number) => JSON.stringify({ amount: 1000 + (n % 1000), currency: 'EUR' });

/** Every `stride`-th offset from 0 to `total`, and every one from 40 before `dense` to `total`. */
function offsets(total: number, dense: number, stride: number): number[] {
  const set = new Set<number>();
  for (let at = 0; at <= total; at += stride) set.add(at);
  for (let at = Math.max(0, dense - 40); at <= total; at++) set.add(at);
  return [...set].sort((a, b) => a - b);
}

/** Retries the whole request through the intact gateway until it is not 409 (at most 5 s). */
async function retryIntact(bytes: Buffer) {
  const started = Date.now();
  for (;;) {
    const answer = await sendRaw(s.gatewayPort, bytes);
    if (answer.status !== 409 || Date.now() - started > 5000) return answer;
    expect(answer.headers['retry-after']).toBeTruthy();
    await pause(20);
  }
}

/** The retry's rules, and one charge row for the key, the one the retry (and any cut answer) names. */
async function expectOneCharge(where: string, key: string, bytes: Buffer, cut: RawAnswer) {
  const retry = await retryIntact(bytes);
  expect(retry.status, `${where}: retry answered ${retry.status} ${retry.body}`).toBe(201);
  const rows = await s.charges(key);
  expect(rows, where).toHaveLength(1);
  const id = (JSON.parse(retry.body.toString()) as { id: string }).id;
  expect(id, where).toBe(rows[0]);
  const seen = /"id":"(ch_[^"]+)"/.exec(cut.body.toString())?.[1];
  if (seen) expect(seen, where).toBe(id);
  return retry;
}

function expectUpstreamProblem(where: string, answer: RawAnswer) {
  expect(answer.timedOut, `${where}: the gateway did not answer`).toBe(false);
  expect([502, 504], `${where}: answered ${answer.status} ${answer.body}`).toContain(answer.status);
  expect(answer.headers['content-type'], where).toMatch(/^application\/problem\+json/);
  const problem = JSON.parse(answer.body.toString()) as { code?: string; retryable?: boolean };
  expect(problem.retryable, where).toBe(true);
  expect(['upstream_unavailable', 'upstream_timeout'], where).toContain(problem.code);
}

let n = 0;

describe('gateway to API link cut', () => {
  it.each(['fin', 'reset'] as CutHow[])(
    'an API answer cut right after its head (%s) is a 502 upstream_unavailable, not a 500 internal_error',
    async (how) => {
      // Was a defect: reply-from hands the API's response stream to reply.send() once its head arrived (gateway/server.ts reply.from), so a link cut before the first body byte reaches the gateway's error handler as an undici socket error with no statusCode and frameworkProblem (gateway/problems.ts) makes it 500 internal_error instead of DESIGN's 502.
      const key = randomUUID();
      const { bytes } = chargeBytes(token, key, body(n++));
      await s.upstreamProxy.arm('response', apiAnswer.headEnd, how);
      const cuts = s.upstreamProxy.cuts;
      const cut = await sendRaw(cutGatewayPort, bytes);
      // The cut happened (the test is not failing for want of one).
      expect(s.upstreamProxy.cuts).toBe(cuts + 1);
      // The charge itself is safe either way: the retry replays the one 201.
      const retry = await expectOneCharge(`${how}@head-end`, key, bytes, cut);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(cut.status, `answered ${cut.status} ${cut.body}`).toBe(502);
      expectUpstreamProblem(`${how}@head-end`, cut);
      expect(JSON.parse(cut.body.toString())).toMatchObject({ code: 'upstream_unavailable' });
    },
  );

  it('a request to the API cut at any offset (FIN or RST) is a 502 problem, and the retry charges once', async () => {
    for (const how of ['fin', 'reset'] as CutHow[]) {
      for (const at of offsets(apiRequest.total, apiRequest.headEnd, 11)) {
        const where = `request ${how}@${at}/${apiRequest.total}`;
        const key = randomUUID();
        const { bytes } = chargeBytes(token, key, body(n++));
        await s.upstreamProxy.arm('request', at, how);
        const cuts = s.upstreamProxy.cuts;
        const cut = await sendRaw(cutGatewayPort, bytes);
        expect(s.upstreamProxy.cuts, `${where}: not cut`).toBe(cuts + 1);
        expectUpstreamProblem(where, cut);
        const retry = await expectOneCharge(where, key, bytes, cut);
        // Only a request that reached the API whole can have run; its retry is then the replay.
        if (at < apiRequest.total) expect(retry.headers['idempotent-replayed'], where).toBeUndefined();
      }
    }
  }, 300_000);

  it('an API answer cut at any other offset: a 502 problem before its head, a short 201 after; the retry replays', async () => {
    for (const how of ['fin', 'reset'] as CutHow[]) {
      for (const at of offsets(apiAnswer.total - 1, apiAnswer.headEnd, 5)) {
        // The head's very end is the defect above.
        if (at === apiAnswer.headEnd) continue;
        const where = `answer ${how}@${at}/${apiAnswer.total}`;
        const key = randomUUID();
        const { bytes } = chargeBytes(token, key, body(n++));
        await s.upstreamProxy.arm('response', at, how);
        const cuts = s.upstreamProxy.cuts;
        const cut = await sendRaw(cutGatewayPort, bytes);
        expect(s.upstreamProxy.cuts, `${where}: not cut`).toBe(cuts + 1);
        expect(cut.timedOut, where).toBe(false);
        if (at < apiAnswer.headEnd) expectUpstreamProblem(where, cut);
        else {
          // The head went on to the client; the body stops short of its Content-Length, and the
          // connection closes: the client can tell it did not get the whole answer.
          expect(cut.status, where).toBe(201);
          expect(cut.body.length, where).toBeLessThan(Number(cut.headers['content-length']));
        }
        const retry = await expectOneCharge(where, key, bytes, cut);
        expect(retry.headers['idempotent-replayed'], where).toBe('true');
      }
    }
  }, 300_000);
});

describe('client to gateway link cut', () => {
  it('a request cut at any offset (Content-Length or chunked, FIN or RST) never charges twice', async () => {
    for (const chunked of [false, true]) {
      for (const how of ['fin', 'reset'] as CutHow[]) {
        const shape = chargeBytes(token, randomUUID(), body(0), { chunked });
        for (const at of offsets(shape.bytes.length, shape.headEnd, 13)) {
          const where = `${chunked ? 'chunked' : 'content-length'} ${how}@${at}/${shape.bytes.length}`;
          const key = randomUUID();
          const { bytes } = chargeBytes(token, key, body(n++), { chunked });
          const cut = await sendRaw(s.gatewayPort, bytes, at, how, 3000);
          expect(cut.timedOut, where).toBe(false);
          expect(cut.status, `${where}: ${cut.body}`).toBeLessThan(500);
          const retry = await expectOneCharge(where, key, bytes, cut);
          // A request that never reached the gateway whole never ran.
          if (at < bytes.length) expect(retry.headers['idempotent-replayed'], where).toBeUndefined();
        }
      }
    }
  }, 300_000);

  it("the gateway's 201 cut at any offset (FIN or RST): the retry replays the same charge", async () => {
    for (const how of ['fin', 'reset'] as CutHow[]) {
      for (const at of offsets(gatewayAnswer.total - 1, gatewayAnswer.headEnd, 7)) {
        const where = `answer ${how}@${at}`;
        const key = randomUUID();
        const { bytes } = chargeBytes(token, key, body(n++));
        await s.frontProxy.arm('response', at, how);
        const cuts = s.frontProxy.cuts;
        const cut = await sendRaw(s.frontProxy.port, bytes);
        expect(s.frontProxy.cuts, `${where}: not cut`).toBe(cuts + 1);
        expect(cut.timedOut, where).toBe(false);
        const retry = await expectOneCharge(where, key, bytes, cut);
        expect(retry.headers['idempotent-replayed'], where).toBe('true');
        expect(retry.headers['cache-control'], where).toBe('no-store');
      }
    }
  }, 300_000);
});

describe('gateway to a silent API', () => {
  it('answers 504 upstream_timeout once upstreamTimeout passes, for an API that accepts and never answers', async () => {
    // Was a defect: no upstream timeout was set, so each request waited for undici's 300 s default.
    const silent = net.createServer(() => undefined);
    const held = new Set<net.Socket>();
    silent.on('connection', (socket) => held.add(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    try {
      const port = (silent.address() as net.AddressInfo).port;
      const gateway = await s.gatewayTo(`http://127.0.0.1:${port}`, { upstreamTimeout: 300 });
      const key = randomUUID();
      const started = performance.now();
      const answer = await sendRaw(Number(new URL(gateway.url).port), chargeBytes(token, key, body(n++)).bytes);
      expect(performance.now() - started).toBeLessThan(10_000);
      expect(answer.status).toBe(504);
      expectUpstreamProblem('silent API', answer);
      expect(JSON.parse(answer.body.toString())).toMatchObject({ code: 'upstream_timeout' });
      expect(await s.charges(key)).toEqual([]);
    } finally {
      for (const socket of held) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });

  it('refuses an upstreamTimeout that is not a whole number of milliseconds', async () => {
    for (const upstreamTimeout of [0, -1, 1.5, Number.NaN]) {
      await expect(s.gatewayTo('http://127.0.0.1:9', { upstreamTimeout })).rejects.toThrow(/upstreamTimeout/);
    }
  });
});
