// The differential runner of differential.test.ts (memory stores, time moving) and
// differential.int.test.ts (Redis and PostgreSQL). One scenario, three frameworks: fast-check generates sequences of requests (keys from a small pool,
// bodies that are or are not the same JSON, other queries, other callers, outcomes the policy stores
// or releases, a response too large to replay, a handler that calls release(), time moving past the
// retention) and sends each to the Express, Fastify and Koa servers
// of the describeAdapter table. Every answer must be what a model of the spec predicts (execute,
// replay, 422, 400) and the same on the three: status, replay marker and body bytes (but the body of a
// thrown handler's 500, which is each framework's own error page).
//
// Left out on purpose: two ids of one parameterised route with one key. Fastify scopes a record by
// the route template, Express and Koa mounted app-wide by the path as matched (docs/concepts.md).
import { randomBytes } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { Readable } from 'node:stream';
import type { Store } from '@idem/core';
import type { AdapterServer, AdapterServerOptions, ScenarioReply, ScenarioRequest } from '@idem/testkit';
import { scenarioRoutes } from '@idem/testkit';
import fc from 'fast-check';
import { expect } from 'vitest';
import { makeExpressServer } from '../../express/test/server.js';
import { makeFastifyServer } from '../../fastify/test/server.js';
import { makeKoaServer } from '../../koa/test/server.js';

const HOUR = 3_600_000;

interface Target {
  name: string;
  make: (options: AdapterServerOptions) => Promise<AdapterServer>;
  server?: AdapterServer;
  /** Handler runs of the current sequence, which the replies number. */
  runs: number;
}

const frameworks = [
  { name: 'express', make: makeExpressServer },
  { name: 'fastify', make: makeFastifyServer },
  { name: 'koa', make: makeKoaServer },
] as const;

function reply(request: ScenarioRequest, n: number): ScenarioReply {
  const amount = (request.body as { amount?: unknown } | undefined)?.amount ?? null;
  switch (request.route) {
    case '/charges':
      return { kind: 'json', status: 201, headers: { location: `/charges/ch_${n}` }, json: { id: `ch_${n}`, amount } };
    case '/charges/:id':
      return { kind: 'json', status: 200, headers: {}, json: { method: request.method, amount, n } };
    case '/declined':
      return { kind: 'json', status: 402, headers: {}, json: { error: 'card_declined', n } };
    case '/limited':
      return { kind: 'json', status: 429, headers: { 'retry-after': '1' }, json: { error: 'slow_down', n } };
    case '/missing':
      return { kind: 'json', status: 404, headers: {}, json: { error: 'no_such_charge', n } };
    case '/text':
      return { kind: 'text', status: 200, headers: { 'content-type': 'text/plain; charset=utf-8' }, text: `t${n}` };
    case '/empty':
      return { kind: 'none', status: 204, headers: {} };
    case '/boom':
      return { kind: 'throw' };
    case '/stream':
      // Over the servers' maxResponseBytes: served whole, kept as response_not_replayable.
      return {
        kind: 'stream',
        status: 200,
        headers: { 'content-type': 'text/plain' },
        stream: () => Readable.from([Buffer.alloc(2_000, 'a'), Buffer.alloc(2_000, 'b')]),
      };
    case '/refunds':
      // The handler says nothing happened: not stored, whatever the policy would decide of a 503.
      request.context?.release();
      return { kind: 'json', status: 503, headers: { 'retry-after': '1' }, json: { error: 'try_later', n } };
    default:
      return { kind: 'json', status: 200, headers: {}, json: { n } };
  }
}

interface Answer {
  status: number;
  replayed: boolean;
  body: Buffer;
  code?: string;
  /** The `Idempotency-Expires` header, when the run advertises expiry. */
  expires: string | undefined;
}

function send(base: string, step: SendStep, run: string): Promise<Answer> {
  const headers: Record<string, string> = { 'x-test-user': step.user };
  // A valid key gets the sequence's own prefix inside it (quoted stays quoted): records in a real
  // store outlive the sequence.
  if (step.key !== undefined) headers['idempotency-key'] = step.key.replace(/^("?)(k\d)/, `$1${run}-$2`);
  const body = bodies[step.body];
  headers['content-type'] = 'application/json';
  headers['content-length'] = String(Buffer.byteLength(body));
  return new Promise((resolve, reject) => {
    const req = httpRequest(new URL(`${step.path}${step.query}`, base), { method: step.method, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        const bytes = Buffer.concat(chunks);
        const answer: Answer = {
          status: res.statusCode ?? 0,
          replayed: res.headers['idempotent-replayed'] === 'true',
          body: bytes,
          expires: res.headers['idempotency-expires'] as string | undefined,
        };
        if (/problem\+json/.test(String(res.headers['content-type']))) {
          answer.code = (JSON.parse(bytes.toString()) as { code?: string }).code;
        }
        resolve(answer);
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

// The same JSON twice (other spacing), and another amount.
const bodies = { a: '{"amount":1}', aSpaced: '{ "amount" : 1 }', b: '{"amount":2}' } as const;
const amountOf = { a: 1, aSpaced: 1, b: 2 } as const;

type Route = {
  method: 'POST' | 'PATCH' | 'PUT';
  path: string;
  template: string;
  status: number;
  stored: boolean;
  /** Kept, but its replays are 500 `response_not_replayable` (too large to store). */
  unreplayable?: true;
};
const routes: readonly Route[] = [
  { method: 'POST', path: '/charges', template: '/charges', status: 201, stored: true },
  { method: 'POST', path: '/declined', template: '/declined', status: 402, stored: true },
  // Policy 'all' releases a 429: the request was refused before doing anything.
  { method: 'POST', path: '/limited', template: '/limited', status: 429, stored: false },
  { method: 'POST', path: '/missing', template: '/missing', status: 404, stored: true },
  { method: 'POST', path: '/text', template: '/text', status: 200, stored: true },
  { method: 'POST', path: '/empty', template: '/empty', status: 204, stored: true },
  { method: 'POST', path: '/boom', template: '/boom', status: 500, stored: true },
  { method: 'POST', path: '/stream', template: '/stream', status: 200, stored: true, unreplayable: true },
  // The handler calls release(): not stored though 'all' would keep a 503.
  { method: 'POST', path: '/refunds', template: '/refunds', status: 503, stored: false },
  { method: 'PATCH', path: '/charges/7', template: '/charges/:id', status: 200, stored: true },
  // PUT is idempotent by definition: not covered, a key on it is ignored (case 29).
  { method: 'PUT', path: '/charges/7', template: '/charges/:id', status: 200, stored: false },
];

interface SendStep {
  kind: 'send';
  method: Route['method'];
  path: string;
  route: Route;
  query: '' | '?x=1';
  user: 'alice' | 'bob';
  /** undefined: no header. */
  key: string | undefined;
  body: keyof typeof bodies;
}
type Step = SendStep | { kind: 'advance'; ms: number };

const keys = ['k1', '"k1"', 'k2', undefined, 'a, b', ''] as const;

const sendStep: fc.Arbitrary<Step> = fc
  .record({
    route: fc.constantFrom(...routes),
    query: fc.constantFrom('' as const, '' as const, '?x=1' as const),
    user: fc.constantFrom('alice' as const, 'alice' as const, 'bob' as const),
    key: fc.constantFrom(...keys),
    body: fc.constantFrom('a' as const, 'aSpaced' as const, 'b' as const),
  })
  .map((s): Step => ({ kind: 'send', method: s.route.method, path: s.route.path, ...s }));

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 9, arbitrary: sendStep },
  { weight: 1, arbitrary: fc.constantFrom<Step>({ kind: 'advance', ms: HOUR }, { kind: 'advance', ms: 25 * HOUR }) },
);

/** What the spec says of one request, given the records so far. */
type Expected =
  | { kind: 'execute'; status: number }
  | { kind: 'replay'; of: string }
  | { kind: 'problem'; status: number; code: string };

interface ModelRecord {
  fingerprint: string;
  expiresAt: number;
}

function expectationOf(s: SendStep, records: Map<string, ModelRecord>, at: number): Expected & { id?: string } {
  if (s.method === 'PUT') return { kind: 'execute', status: s.route.status };
  if (s.key === undefined) return { kind: 'problem', status: 400, code: 'key_missing' };
  if (s.key === '' || s.key.includes(',')) return { kind: 'problem', status: 400, code: 'key_invalid' };
  const id = `${s.user} ${s.method} ${s.route.template} ${s.key.replaceAll('"', '')}`;
  const fingerprint = `${s.path}${s.query} ${amountOf[s.body]}`;
  const record = records.get(id);
  if (record === undefined || record.expiresAt <= at) return { kind: 'execute', status: s.route.status, id };
  if (record.fingerprint !== fingerprint) return { kind: 'problem', status: 422, code: 'fingerprint_mismatch' };
  return { kind: 'replay', of: id };
}

/** What {@link runDifferential} needs: a fresh store per framework, and whether time can move. */
export interface DifferentialOptions {
  /** A store for one framework's server; each server must have its own. */
  store(framework: string): Store;
  /** Moves every store's clock; without it, sequences keep to one instant. */
  advance?: (ms: number) => void;
  /**
   * The clock of the stores, given to the engines too: the servers then advertise expiry, and each
   * `Idempotency-Expires` is checked (only with a clock that moves by steps: a real one could pass
   * a second between the three answers).
   */
  now?: () => number;
  numRuns: number;
}

/** A started run: the three servers, and the property to check. */
export interface Differential {
  check(): Promise<{ sequences: number; requests: number }>;
  close(): Promise<void>;
}

/**
 * Starts the Express, Fastify and Koa servers of the describeAdapter table, each on its own store,
 * and returns the property: generated sequences, each request sent to the three, every answer checked
 * against the model and against the other two.
 *
 * @example
 * const run = await startDifferential({ store: () => memoryStore(), numRuns: 50 });
 * await run.check();
 */
export async function startDifferential(options: DifferentialOptions): Promise<Differential> {
  const targets: Target[] = [];
  for (const framework of frameworks) {
    const target: Target = { ...framework, runs: 0 };
    target.server = await framework.make({
      idempotency: {
        store: options.store(framework.name),
        storeTimeout: '15s',
        // Below the /stream route's 4,000 bytes.
        maxResponseBytes: 3_000,
        ...(options.now ? { now: options.now, advertiseExpiry: true } : {}),
      },
      routes: scenarioRoutes,
      handle: async (request) => reply(request, ++target.runs),
    });
    targets.push(target);
  }
  const steps = fc.array(options.advance ? step : sendStep, { minLength: 5, maxLength: 40, size: 'max' });
  // The model's clock: only `advance` moves it.
  let at = 0;

  const check = async () => {
    let sequences = 0;
    let requests = 0;
    await fc.assert(
      fc.asyncProperty(steps, async (sequence) => {
        sequences++;
        // A fresh start: keys of the sequence's own, past every record of the last one, handler
        // counts from zero.
        const run = randomBytes(6).toString('hex');
        for (const target of targets) target.runs = 0;
        const records = new Map<string, ModelRecord>();
        // The first answer each target gave for a record, which its replays must repeat byte for byte.
        const firsts = new Map<string, Answer[]>();
        for (const s of sequence) {
          if (s.kind === 'advance') {
            options.advance?.(s.ms);
            at += s.ms;
            continue;
          }
          requests++;
          const expected = expectationOf(s, records, at);
          const answers = await Promise.all(targets.map((target) => send(target.server!.url, s, run)));
          const where = `${s.method} ${s.path}${s.query} as ${s.user}, key ${JSON.stringify(s.key)}, body ${s.body}`;
          // A stored execution announces its retention from now (the default 24 h); a replay repeats it.
          const stores = expected.kind === 'execute' && expected.id !== undefined && s.route.stored;
          const expires =
            options.now && stores
              ? new Date(Math.floor((options.now() + 24 * HOUR) / 1000) * 1000).toUTCString()
              : undefined;
          for (const [i, answer] of answers.entries()) {
            const label = `${targets[i]!.name}: ${where}`;
            if (options.now && expected.kind !== 'replay') expect(answer.expires, `${label}: expiry`).toBe(expires);
            if (expected.kind === 'replay') {
              expect(answer.expires, `${label}: expiry`).toBe(firsts.get(expected.of)?.[i]?.expires);
            }
            if (expected.kind === 'problem') {
              expect({ status: answer.status, code: answer.code }, label).toEqual({
                status: expected.status,
                code: expected.code,
              });
            } else if (expected.kind === 'execute') {
              expect({ status: answer.status, replayed: answer.replayed }, label).toEqual({
                status: expected.status,
                replayed: false,
              });
            } else if (s.route.unreplayable) {
              expect({ status: answer.status, replayed: answer.replayed, code: answer.code }, label).toEqual({
                status: 500,
                replayed: true,
                code: 'response_not_replayable',
              });
            } else {
              const first = firsts.get(expected.of)?.[i];
              expect(answer.replayed, label).toBe(true);
              expect(answer.status, label).toBe(first?.status);
              expect(answer.body.equals(first!.body), `${label}: replayed bytes`).toBe(true);
            }
          }
          // Alike on the three, but a thrown handler's error page, which is each framework's own.
          const comparable = s.route.status !== 500 || expected.kind === 'problem';
          for (const answer of answers.slice(1)) {
            expect(answer.status, where).toBe(answers[0]!.status);
            expect(answer.replayed, where).toBe(answers[0]!.replayed);
            if (comparable) expect(answer.body.toString(), where).toBe(answers[0]!.body.toString());
          }
          if (expected.kind === 'execute' && expected.id !== undefined && s.route.stored) {
            const fingerprint = `${s.path}${s.query} ${amountOf[s.body]}`;
            records.set(expected.id, { fingerprint, expiresAt: at + 24 * HOUR });
            firsts.set(expected.id, answers);
          }
        }
        // Every execution the model predicted ran once on each framework, and nothing more.
        for (const target of targets) expect(target.runs, target.name).toBe(targets[0]!.runs);
        // The sequence's records never meet the next one's: with a clock, it moves past them.
        options.advance?.(30 * 24 * HOUR);
        at += 30 * 24 * HOUR;
      }),
      { numRuns: options.numRuns },
    );
    return { sequences, requests };
  };

  return {
    check,
    close: async () => {
      await Promise.all(targets.map((target) => target.server?.close()));
    },
  };
}
