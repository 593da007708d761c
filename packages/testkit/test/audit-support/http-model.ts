// A reference model of DESIGN.md's HTTP table and state machine, and the runner that plays random
// sequences of requests against the Express, Fastify and Koa servers of the describeAdapter table
// (http-model.audit.int.test.ts). What differential.ts does not reach: a first request still
// running (409 + Retry-After), hangs finished later or after the client left, leases that run out
// under a hanging handler (taken over by the same request, 422 for another, the late finisher
// fenced), minted keys and their retries, a request header in the fingerprint and one that is not,
// 413, a caller missing, and bursts of concurrent requests.
//
// Every response is compared with the model (status, Idempotent-Replayed, the echoed key,
// Retry-After, Cache-Control, the problem's code, the body) and the three frameworks with each other.
import { request as httpRequest } from 'node:http';
import { Readable } from 'node:stream';
import type { Store } from '@idem/core';
import type { AdapterServer, AdapterServerOptions, ScenarioReply, ScenarioRequest } from '@idem/testkit';
import { scenarioRoutes } from '@idem/testkit';
import fc from 'fast-check';
import { expect } from 'vitest';
import { makeExpressServer } from '../../../express/test/server.js';
import { makeFastifyServer } from '../../../fastify/test/server.js';
import { makeKoaServer } from '../../../koa/test/server.js';

export const HOUR = 3_600_000;
const RETENTION = 24 * HOUR;
/** Below the `big` act's 4,000 bytes, above every other answer. */
const MAX_RESPONSE = 3_000;
/** Below the padded body of `oversized` requests. */
const MAX_BODY = 2_048;

export const frameworks = [
  { name: 'express', make: makeExpressServer },
  { name: 'fastify', make: makeFastifyServer },
  { name: 'koa', make: makeKoaServer },
] as const;
export type FrameworkName = (typeof frameworks)[number]['name'];

/** What the handler does, by the body's `act`. */
export const acts = ['ok', 'declined', 'limited', 'throw', 'release', 'stream', 'big', 'hang', 'hangThrow'] as const;
export type Act = (typeof acts)[number];

/** The operations of the sequences: PUT is not covered (idempotent by definition), a key there is ignored. */
export const endpoints = [
  { method: 'POST', path: '/charges', template: '/charges', covered: true },
  { method: 'POST', path: '/refunds', template: '/refunds', covered: true },
  { method: 'PATCH', path: '/charges/7', template: '/charges/:id', covered: true },
  { method: 'PUT', path: '/charges/7', template: '/charges/:id', covered: false },
] as const;

/**
 * How the key field is sent. `' k1 '` is `k1` (optional whitespace), `'"k1"'` too (an sf-string);
 * `''`, `'a, b'` and one over 255 bytes are malformed; `minted` resends the key the server minted for
 * the last request that had none (each framework its own).
 */
export const keyFields = ['k1', '"k1"', ' k1 ', 'k2', 'k3', '', 'a, b', 'x'.repeat(256)] as const;
export type KeySpec = { kind: 'none' } | { kind: 'field'; field: (typeof keyFields)[number] } | { kind: 'minted' };

export interface Req {
  user: 'alice' | 'bob' | null;
  key: KeySpec;
  endpoint: number;
  act: Act;
  amount: 1 | 2;
  /** The same JSON with other whitespace: the same request. */
  spaced: boolean;
  query: '' | '?x=1';
  /** `api-version`, which is in the fingerprint. */
  version: 'v1' | 'v2' | undefined;
  /** `x-trace`, which is not: its value changes on every attempt. */
  trace: string;
  /** Padded past maxBodyBytes: 413. */
  oversized: boolean;
}

/** How a retry differs from the request it repeats (`same`: only its `x-trace`, which is not in the identity). */
export const variations = [
  'same',
  'same',
  'same',
  'same',
  'spaced',
  'quoted',
  'amount',
  'act',
  'user',
  'version',
  'query',
  'endpoint',
] as const;
export type Variation = (typeof variations)[number];

export type Step =
  | { kind: 'send'; req: Req }
  /** Sends again the request `of` (counted back from the last), changed by `vary`. */
  | { kind: 'retry'; of: number; vary: Variation; act: Act }
  | { kind: 'finish'; pending: number }
  | { kind: 'abort'; pending: number }
  | { kind: 'advance'; ms: number };

/** One configuration of the servers: how a request without a key is treated, and the heartbeat. */
export interface Config {
  name: string;
  keys: 'required' | 'minted' | 'optional';
  /** Off: leases run out under a hanging handler when time moves past them. */
  heartbeat: boolean;
  /** The outcome policy preset. */
  policy: 'all' | 'stripe' | 'success';
}

export const configs: readonly Config[] = [
  { name: "required keys, heartbeat, policy 'all'", keys: 'required', heartbeat: true, policy: 'all' },
  { name: "minted keys, no heartbeat, policy 'stripe'", keys: 'minted', heartbeat: false, policy: 'stripe' },
  { name: "optional keys, no heartbeat, policy 'success'", keys: 'optional', heartbeat: false, policy: 'success' },
];

// ---------------------------------------------------------------------------------------------
// Generators

// No caller and a body over the limit: Fastify answers 413 where Express and Koa answer 500
// scope_missing (see the example test); left out of the random sequences.
const reqArbitrary: fc.Arbitrary<Req> = fc.record({
  user: fc.oneof(
    { weight: 10, arbitrary: fc.constantFrom<Req['user']>('alice', 'alice', 'bob') },
    { weight: 1, arbitrary: fc.constant(null) },
  ),
  key: fc.oneof(
    {
      weight: 12,
      arbitrary: fc
        .constantFrom('k1', '"k1"', ' k1 ', 'k2', 'k2', 'k3')
        .map((field) => ({ kind: 'field', field }) as KeySpec),
    },
    {
      weight: 1,
      arbitrary: fc.constantFrom('', 'a, b', 'x'.repeat(256)).map((field) => ({ kind: 'field', field }) as KeySpec),
    },
    { weight: 1, arbitrary: fc.constant<KeySpec>({ kind: 'none' }) },
    { weight: 1, arbitrary: fc.constant<KeySpec>({ kind: 'minted' }) },
  ),
  endpoint: fc.constantFrom(0, 0, 0, 1, 2, 3),
  act: fc.oneof(
    { weight: 4, arbitrary: fc.constant<Act>('ok') },
    { weight: 4, arbitrary: fc.constantFrom<Act>('hang', 'hang', 'hangThrow') },
    { weight: 6, arbitrary: fc.constantFrom<Act>('declined', 'limited', 'throw', 'release', 'stream', 'big') },
  ),
  amount: fc.constantFrom<1 | 2>(1, 1, 2),
  spaced: fc.boolean(),
  query: fc.constantFrom<Req['query']>('', '', '', '?x=1'),
  version: fc.constantFrom<Req['version']>(undefined, undefined, 'v1', 'v2'),
  trace: fc.string({ minLength: 1, maxLength: 6, unit: fc.constantFrom(...'abcdef0123') }),
  oversized: fc.oneof({ weight: 15, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
});

/** A step; `finish` and `abort` name a pending hang by its index among the unfinished ones. */
export const stepArbitrary = (leaseMs: number, withTime: boolean): fc.Arbitrary<Step> =>
  fc.oneof(
    { weight: 6, arbitrary: reqArbitrary.map((req): Step => ({ kind: 'send', req })) },
    {
      weight: 8,
      arbitrary: fc
        .record({ of: fc.nat(3), vary: fc.constantFrom(...variations), act: fc.constantFrom(...acts) })
        .map((r): Step => ({ kind: 'retry', ...r })),
    },
    { weight: 4, arbitrary: fc.nat(3).map((pending): Step => ({ kind: 'finish', pending })) },
    { weight: 1, arbitrary: fc.nat(3).map((pending): Step => ({ kind: 'abort', pending })) },
    {
      weight: withTime ? 3 : 0,
      arbitrary: fc.constantFrom<Step>(
        { kind: 'advance', ms: leaseMs + 1 },
        { kind: 'advance', ms: leaseMs + 1 },
        { kind: 'advance', ms: 25 * HOUR },
      ),
    },
  );

// ---------------------------------------------------------------------------------------------
// The model

/** What the model says one response is. */
export type Expected =
  | {
      kind: 'execute';
      status: number;
      stored: 'yes' | 'no' | 'unreplayable' | 'pending';
      echo: 'sent' | 'minted' | 'none';
    }
  | { kind: 'replay'; of: Reply }
  | { kind: 'problem'; status: number; code: string; retryAfter?: string };

/** A stored outcome: the first answer of each framework, which every replay repeats byte for byte. */
interface Reply {
  /** The answer as each framework gave it (undefined when its client left before reading it). */
  answers: Partial<Record<FrameworkName, Answer>>;
  /** Kept as `500 response_not_replayable`. */
  unreplayable: boolean;
  status: number;
  /** The body, when the model knows it (not a thrown handler's page). */
  body: string | undefined;
  location: string | undefined;
}

type Rec =
  | { state: 'running'; fp: string; claim: number; leaseEnd: number }
  | { state: 'done'; fp: string; expiresAt: number; reply: Reply };

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/** What a request is, to the fingerprint: method, route, path, query, the identity header, the body. */
function fingerprintOf(req: Req): string {
  const e = endpoints[req.endpoint]!;
  return `${e.method} ${e.template} ${e.path}${req.query} v=${req.version ?? ''} ${req.act} ${req.amount}`;
}

export function bodyOf(req: Req): string {
  if (req.oversized) return JSON.stringify({ act: req.act, amount: req.amount, pad: 'p'.repeat(MAX_BODY) });
  return req.spaced
    ? `{ "act" : "${req.act}" , "amount" : ${req.amount} }`
    : JSON.stringify({ act: req.act, amount: req.amount });
}

/** The body a JSON act answers with, run `n` of its framework. */
function jsonReply(act: Act, amount: number, n: number): ScenarioReply {
  switch (act) {
    case 'declined':
      return { kind: 'json', status: 402, headers: {}, json: { error: 'card_declined', n } };
    case 'limited':
      return { kind: 'json', status: 429, headers: { 'retry-after': '7' }, json: { error: 'slow_down', n } };
    case 'release':
      return { kind: 'json', status: 503, headers: { 'retry-after': '3' }, json: { error: 'upstream_down', n } };
    default:
      return {
        kind: 'json',
        status: 201,
        headers: { location: `/charges/ch_${n}` },
        json: { id: `ch_${n}`, act, amount },
      };
  }
}

const statusOf: Record<Act, number> = {
  ok: 201,
  declined: 402,
  limited: 429,
  throw: 500,
  release: 503,
  stream: 200,
  big: 200,
  hang: 201,
  hangThrow: 500,
};

// ---------------------------------------------------------------------------------------------
// The servers

interface Pending {
  /** The model's name for it: its place among the sequence's hangs. */
  id: number;
  /** Per framework: the answer once it came (or its failure when the client left). */
  answers: Partial<Record<FrameworkName, Promise<Answer>>>;
  /** Per framework: abort the client's request. */
  abort: Partial<Record<FrameworkName, () => void>>;
  /** Per framework: the handler's gate. */
  open: Partial<Record<FrameworkName, () => void>>;
  /** Per framework: the key field sent. */
  sent: Record<FrameworkName, string | undefined>;
  req: Req;
  /** The record it holds, or undefined for a request that claims nothing. */
  record: string | undefined;
  /** Its claim, in the model: the record is still its own while it holds this number. */
  claim: number;
  /** Its run number (the `n` of its answer). */
  n: number;
  /** It took the record over from an attempt whose lease ran out. */
  recovered: boolean;
  aborted: boolean;
  expected: Extract<Expected, { kind: 'execute' }>;
}

interface Target {
  name: FrameworkName;
  server: AdapterServer;
  /** Handler runs (the `n` of the replies). */
  runs: number;
  /** Handlers waiting at their gate, in the order they entered. */
  gates: (() => void)[];
  /** Resolves the next time a handler enters its gate. */
  entered: (() => void)[];
  /** Settlements (store complete, release, or a lease ended) that finished. */
  settled: number;
  settledWaiters: (() => void)[];
  /** The key the server minted last, for `minted` resends. */
  lastMinted: string | undefined;
}

/** A store wrapper counting finished settlements, so a finished hang whose client left can be awaited. */
function counting(store: Store, target: () => Target): Store {
  const done = () => {
    const t = target();
    t.settled++;
    for (const w of t.settledWaiters.splice(0)) w();
  };
  const after = <T>(value: T | Promise<T>): T | Promise<T> => {
    if (value instanceof Promise) return value.finally(done);
    done();
    return value;
  };
  const wrapped: Store = {
    claim: (input) => store.claim(input),
    renew: (input) => (input.leaseMs === 1 ? after(store.renew(input)) : store.renew(input)),
    complete: (input) => after(store.complete(input)),
    release: (input) => after(store.release(input)),
    get: (id) => store.get(id),
  };
  if (store.inProcess) (wrapped as { inProcess?: boolean }).inProcess = true;
  return wrapped;
}

// `k1` and `"k1"` are one key; ` k1 ` too. (Only the spellings the generator makes.)
function toggleQuotes(field: (typeof keyFields)[number]): (typeof keyFields)[number] {
  const bare = field.trim().replaceAll('"', '') as 'k1' | 'k2' | 'k3';
  return field.includes('"') ? bare : bare === 'k1' ? '"k1"' : bare;
}

/** `req` sent again, changed by `vary` (`act`: the act a retry with another body asks for). */
function varied(req: Req, vary: Variation, act: Act): Req {
  const again = { ...req, trace: `${req.trace}r` };
  switch (vary) {
    case 'same':
      return again;
    case 'spaced':
      return { ...again, spaced: !req.spaced };
    case 'quoted':
      return req.key.kind === 'field' && /^\s*"?k\d"?\s*$/.test(req.key.field)
        ? { ...again, key: { kind: 'field', field: toggleQuotes(req.key.field) } }
        : again;
    case 'amount':
      return { ...again, amount: req.amount === 1 ? 2 : 1 };
    case 'act':
      return { ...again, act };
    case 'user':
      return { ...again, user: req.user === 'alice' ? 'bob' : 'alice' };
    case 'version':
      return { ...again, version: req.version === 'v1' ? 'v2' : 'v1' };
    case 'query':
      return { ...again, query: req.query === '' ? '?x=1' : '' };
    case 'endpoint':
      return { ...again, endpoint: (req.endpoint + 1) % endpoints.length };
  }
}

function ignore() {
  // Observed elsewhere.
}

/** `promise`, or a failure saying `what` after `ms`: a server that never answers fails the test, not the run. */
export function within<T>(promise: Promise<T>, ms: number, what: () => string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what()}`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

export interface ModelRunOptions {
  /** A fresh store for one framework under one configuration. */
  store(framework: FrameworkName, config: Config): Store;
  /** The shared clock of the engines (and of the stores that take one). */
  now(): number;
  /** Moves every clock, the stores' included. */
  advance(ms: number): Promise<void>;
  leaseMs: number;
  numRuns: number;
  /** Seed and path to replay a failure. */
  seed?: number;
  path?: string;
}

/** One request of a burst: a caller, a key, and a body (its act `ok` or `hang`, its amount). */
export interface BurstReq {
  user: 'alice' | 'bob';
  key: 'k1' | 'k2';
  act: 'ok' | 'hang';
  amount: 1 | 2;
}

export const burstArbitrary = fc.array(
  fc.record({
    user: fc.constantFrom<BurstReq['user']>('alice', 'bob'),
    key: fc.constantFrom<BurstReq['key']>('k1', 'k2'),
    act: fc.constantFrom<BurstReq['act']>('ok', 'hang'),
    amount: fc.constantFrom<BurstReq['amount']>(1, 1, 2),
  }),
  { minLength: 4, maxLength: 16 },
);

export interface ModelRun {
  /**
   * Sends every request of `burst` at once to each framework (the three at once too), lets every
   * hang go once each request has run or been answered, then checks the invariants: one handler run
   * per record, every other answer a 409, a byte-equal replay of that run (same body) or a 422
   * (another body), and a retry of each afterwards the replay or the 422.
   */
  burst(burst: BurstReq[]): Promise<void>;
  /**
   * A hang claims a key, its lease runs out (no heartbeat), then `same` retries of its request and
   * `other` requests with another body go at once: exactly one retry takes the key over and runs, the
   * others get 409 (or 422, another body, before the takeover). The first finisher is fenced (its
   * answer served, not stored), the takeover's answer is what a later retry replays.
   */
  takeoverBurst(same: number, other: number): Promise<void>;
  check(config: Config): Promise<{ sequences: number; requests: number; coverage: Record<string, number> }>;
  /** One given sequence, for the minimised examples. */
  play(config: Config, steps: Step[]): Promise<void>;
  close(): Promise<void>;
}

/**
 * Starts the three servers for each configuration, and returns the checks.
 */
export async function startModelRun(options: ModelRunOptions): Promise<ModelRun> {
  const byConfig = new Map<string, Target[]>();
  for (const config of configs) {
    const targets: Target[] = [];
    for (const framework of frameworks) {
      const target = {
        name: framework.name,
        runs: 0,
        gates: [],
        entered: [],
        settled: 0,
        settledWaiters: [],
        lastMinted: undefined,
      } as unknown as Target;
      const handle = async (request: ScenarioRequest): Promise<ScenarioReply> => {
        const n = ++target.runs;
        const body = request.body as { act?: Act; amount?: number } | undefined;
        const act = body?.act ?? 'ok';
        const amount = body?.amount ?? 0;
        switch (act) {
          case 'throw':
            return { kind: 'throw' };
          case 'release':
            request.context?.release();
            return jsonReply(act, amount, n);
          case 'stream':
            return {
              kind: 'stream',
              status: 200,
              headers: { 'content-type': 'text/plain' },
              stream: () => Readable.from([Buffer.from(`s${n}:`), Buffer.alloc(500, 'a'), Buffer.alloc(500, 'b')]),
            };
          case 'big':
            return {
              kind: 'stream',
              status: 200,
              headers: { 'content-type': 'text/plain' },
              stream: () => Readable.from([Buffer.alloc(2_000, 'a'), Buffer.alloc(2_000, 'b')]),
            };
          case 'hang':
          case 'hangThrow': {
            await new Promise<void>((resolve) => {
              target.gates.push(resolve);
              for (const w of target.entered.splice(0)) w();
            });
            return act === 'hang' ? jsonReply('ok', amount, n) : { kind: 'throw' };
          }
          default:
            return jsonReply(act, amount, n);
        }
      };
      const serverOptions: AdapterServerOptions = {
        idempotency: {
          store: counting(options.store(framework.name, config), () => target),
          storeTimeout: '15s',
          maxResponseBytes: MAX_RESPONSE,
          maxBodyBytes: MAX_BODY,
          now: options.now,
          lease: options.leaseMs,
          heartbeat: config.heartbeat,
          required: config.keys === 'required',
          mintKeys: config.keys === 'minted',
          fingerprint: { headers: ['api-version'] },
          storeOutcome: config.policy,
        },
        routes: scenarioRoutes,
        handle,
      };
      target.server = await framework.make(serverOptions);
      targets.push(target);
    }
    byConfig.set(config.name, targets);
  }

  const sendOne = (target: Target, req: Req, run: string): { answer: Promise<Answer>; abort: () => void } => {
    const e = endpoints[req.endpoint]!;
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-trace': req.trace };
    if (req.user !== null) headers['x-test-user'] = req.user;
    if (req.version !== undefined) headers['api-version'] = req.version;
    if (req.key.kind === 'field') {
      // A valid key gets the sequence's own prefix inside it: records in a real store outlive the sequence.
      headers['idempotency-key'] = req.key.field.replace(/^(\s*"?)(k\d)/, `$1${run}-$2`);
    } else if (req.key.kind === 'minted' && target.lastMinted !== undefined) {
      headers['idempotency-key'] = target.lastMinted;
    }
    const body = bodyOf(req);
    headers['content-length'] = String(Buffer.byteLength(body));
    let abort = () => {};
    const answer = new Promise<Answer>((resolve, reject) => {
      const r = httpRequest(
        new URL(`${e.path}${req.query}`, target.server.url),
        { method: e.method, headers, agent: false },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
          );
          res.on('error', reject);
        },
      );
      r.on('error', reject);
      abort = () => r.destroy();
      r.end(body);
    });
    return { answer, abort: () => abort() };
  };

  const close = async () => {
    for (const targets of byConfig.values()) {
      for (const t of targets) for (const g of t.gates.splice(0)) g();
      await Promise.all(targets.map((t) => t.server.close()));
    }
  };

  let sequenceNumber = 0;
  const play = async (config: Config, steps: Step[], coverage: Record<string, number> = {}) => {
    const targets = byConfig.get(config.name)!;
    const run = `${Date.now().toString(36)}${(++sequenceNumber).toString(36)}`;
    const cover = (what: string) => {
      coverage[what] = (coverage[what] ?? 0) + 1;
    };
    for (const t of targets) {
      t.runs = 0;
      t.lastMinted = undefined;
    }
    const records = new Map<string, Rec>();
    let runs = 0;
    let claims = 0;
    let at = 0;
    const live: Pending[] = [];
    let hangs = 0;
    // The model's name of the key the servers minted last (each its own), once its answer came.
    let mintedKey: string | undefined;
    // A recovered run that was released ends its lease 1 ms later: the clock moves past it first.
    let tick = false;
    const trail: string[] = [];
    // What was sent so far, for retries.
    const history: Req[] = [];
    const fail = (where: string) => `${where}\n  ${trail.join('\n  ')}`;

    const recordOf = (id: string): Rec | undefined => {
      const rec = records.get(id);
      if (rec === undefined) return undefined;
      const end = rec.state === 'done' ? rec.expiresAt : rec.leaseEnd + RETENTION;
      if (end <= at) {
        records.delete(id);
        return undefined;
      }
      return rec;
    };

    const fieldFor = (t: Target, req: Req) =>
      req.key.kind === 'field'
        ? req.key.field.replace(/^(\s*"?)(k\d)/, `$1${run}-$2`)
        : req.key.kind === 'minted'
          ? t.lastMinted
          : undefined;

    const predict = (req: Req): { expected: Expected; id?: string } => {
      const e = endpoints[req.endpoint]!;
      const pass: Expected = { kind: 'execute', status: statusOf[req.act], stored: 'no', echo: 'none' };
      if (!e.covered) return { expected: pass };
      let keyName: string;
      let echo: 'sent' | 'minted' = 'sent';
      if (req.key.kind === 'none' || (req.key.kind === 'minted' && mintedKey === undefined)) {
        if (config.keys === 'optional') return { expected: pass };
        if (config.keys === 'required') return { expected: { kind: 'problem', status: 400, code: 'key_missing' } };
        keyName = `minted#${claims + 1}`;
        echo = 'minted';
      } else if (req.key.kind === 'minted') {
        keyName = mintedKey!;
      } else {
        const field = req.key.field.trim();
        if (field === '' || field.includes(',') || field.length > 255)
          return { expected: { kind: 'problem', status: 400, code: 'key_invalid' } };
        keyName = field.replaceAll('"', '');
      }
      // The body before the caller: an oversized one is 413 even with no caller (all three adapters).
      if (req.oversized) return { expected: { kind: 'problem', status: 413, code: 'body_too_large' } };
      if (req.user === null) return { expected: { kind: 'problem', status: 500, code: 'scope_missing' } };
      const id = `${req.user} ${e.method} ${e.template} ${keyName}`;
      const rec = recordOf(id);
      const fp = fingerprintOf(req);
      const keeps = keepsOf(req.act);
      const stored: 'yes' | 'no' | 'unreplayable' | 'pending' =
        req.act === 'hang' || req.act === 'hangThrow'
          ? 'pending'
          : req.act === 'release' || !keeps
            ? 'no'
            : req.act === 'big'
              ? 'unreplayable'
              : 'yes';
      const executes: Expected = { kind: 'execute', status: statusOf[req.act], stored, echo };
      if (rec === undefined) return { expected: executes, id };
      if (rec.state === 'running') {
        if (config.heartbeat || at < rec.leaseEnd)
          return { expected: { kind: 'problem', status: 409, code: 'in_progress', retryAfter: '1' }, id };
        if (rec.fp !== fp) return { expected: { kind: 'problem', status: 422, code: 'fingerprint_mismatch' }, id };
        cover('takeover');
        return { expected: executes, id };
      }
      if (rec.fp !== fp) return { expected: { kind: 'problem', status: 422, code: 'fingerprint_mismatch' }, id };
      return { expected: { kind: 'replay', of: rec.reply }, id };
    };

    /** Whether the policy keeps what `act` answers (the presets of outcome-policy.ts). */
    const keepsOf = (act: Act): boolean => {
      const status = statusOf[act];
      const thrown = act === 'throw' || act === 'hangThrow';
      if (config.policy === 'all') return status !== 429;
      if (config.policy === 'stripe') return !thrown && status !== 429;
      return !thrown && status >= 200 && status < 300;
    };

    /** The body a run of `req` writes, when the model knows it. */
    const bodyFor = (req: Req, n: number): string | undefined => {
      if (req.act === 'throw' || req.act === 'hangThrow' || req.act === 'big') return undefined;
      if (req.act === 'stream') return `s${n}:${'a'.repeat(500)}${'b'.repeat(500)}`;
      return JSON.stringify((jsonReply(req.act === 'hang' ? 'ok' : req.act, req.amount, n) as { json: unknown }).json);
    };

    const checkAnswers = (
      label: string,
      expected: Expected,
      answers: Partial<Record<FrameworkName, Answer>>,
      req: Req,
      sent: Record<FrameworkName, string | undefined>,
      n: number,
    ) => {
      for (const t of targets) {
        const a = answers[t.name];
        if (a === undefined) continue;
        const where = fail(`${t.name}: ${label}`);
        const replayed = a.headers['idempotent-replayed'];
        const problem = /problem\+json/.test(String(a.headers['content-type']))
          ? (JSON.parse(a.body.toString()) as { code?: string })
          : undefined;
        if (expected.kind === 'problem') {
          expect(
            {
              status: a.status,
              code: problem?.code,
              replayed,
              retryAfter: a.headers['retry-after'],
              cache: a.headers['cache-control'],
            },
            where,
          ).toEqual({
            status: expected.status,
            code: expected.code,
            replayed: undefined,
            retryAfter: expected.retryAfter,
            cache: 'no-store',
          });
          continue;
        }
        if (expected.kind === 'execute') {
          expect({ status: a.status, replayed }, where).toEqual({ status: expected.status, replayed: undefined });
          const echoed = a.headers['idempotency-key'];
          if (expected.echo === 'none') expect(echoed, `${where}: no echo`).toBeUndefined();
          else if (expected.echo === 'sent') expect(echoed, `${where}: echo`).toBe(sent[t.name]?.trim());
          else expect(echoed, `${where}: minted echo`).toMatch(/^[0-9a-f-]{36}$/);
          const body = bodyFor(req, n);
          if (body !== undefined) expect(a.body.toString('latin1'), `${where}: body`).toBe(body);
          if (expected.status === 201) expect(a.headers.location, `${where}: location`).toBe(`/charges/ch_${n}`);
          continue;
        }
        const of = expected.of;
        expect(a.headers['idempotency-key'], `${where}: echo`).toBe(sent[t.name]?.trim());
        if (of.unreplayable) {
          expect({ status: a.status, replayed, code: problem?.code }, where).toEqual({
            status: 500,
            replayed: 'true',
            code: 'response_not_replayable',
          });
          continue;
        }
        const first = of.answers[t.name];
        expect({ status: a.status, replayed, cache: a.headers['cache-control'] }, where).toEqual({
          status: first?.status ?? of.status,
          replayed: 'true',
          cache: 'no-store',
        });
        const bytes = first?.body.toString('latin1') ?? of.body;
        if (bytes !== undefined) expect(a.body.toString('latin1'), `${where}: replayed bytes`).toBe(bytes);
        const location = first?.headers.location ?? of.location;
        expect(a.headers.location, `${where}: location`).toBe(location);
      }
      // Alike on the three (a thrown handler's 500 page is each framework's own).
      const list = targets.map((t) => answers[t.name]).filter((a): a is Answer => a !== undefined);
      const b = list[0];
      for (const a of list.slice(1)) {
        const where = fail(`alike: ${label}`);
        expect(a.status, where).toBe(b!.status);
        expect(a.headers['idempotent-replayed'], where).toBe(b!.headers['idempotent-replayed']);
        expect(a.headers['retry-after'], where).toBe(b!.headers['retry-after']);
        expect(a.headers['cache-control'], where).toBe(b!.headers['cache-control']);
        // (A minted key is each server's own.)
        if (req.key.kind !== 'minted' && (expected.kind !== 'execute' || expected.echo !== 'minted'))
          expect(a.headers['idempotency-key'], where).toBe(b!.headers['idempotency-key']);
        if ((req.act !== 'throw' && req.act !== 'hangThrow') || /problem/.test(String(b!.headers['content-type'])))
          expect(a.body.toString('latin1'), where).toBe(b!.body.toString('latin1'));
      }
    };

    const settle = (id: string, fp: string, answers: Partial<Record<FrameworkName, Answer>>, req: Req, n: number) => {
      records.set(id, {
        state: 'done',
        fp,
        expiresAt: at + RETENTION,
        reply: {
          answers,
          unreplayable: req.act === 'big',
          status: statusOf[req.act],
          body: bodyFor(req, n),
          location: statusOf[req.act] === 201 ? `/charges/ch_${n}` : undefined,
        },
      });
    };

    const finishPending = async (p: Pending) => {
      live.splice(live.indexOf(p), 1);
      const before = targets.map((t) => t.settled);
      const label = `finish #${p.id}${p.aborted ? ' (client gone)' : ''}`;
      trail.push(label);
      for (const t of targets) p.open[t.name]?.();
      const rec = p.record === undefined ? undefined : recordOf(p.record);
      const holds = rec !== undefined && rec.state === 'running' && rec.claim === p.claim;
      if (p.record !== undefined && !holds) cover('fenced finish');
      const answers: Partial<Record<FrameworkName, Answer>> = {};
      if (!p.aborted) {
        for (const t of targets)
          answers[t.name] = await within(p.answers[t.name]!, 10_000, () => fail(`${t.name}: no answer: ${label}`));
        checkAnswers(label, { ...p.expected, status: statusOf[p.req.act] }, answers, p.req, p.sent, p.n);
        if (p.expected.echo === 'minted') {
          for (const t of targets) t.lastMinted = answers[t.name]!.headers['idempotency-key'] as string;
          mintedKey = p.record?.split(' ').at(-1);
        }
      } else if (p.record !== undefined) {
        // Its client left: the outcome is settled all the same, without an answer to wait for.
        cover('finish after client left');
        await within(
          Promise.all(
            targets.map(async (t, i) => {
              while (t.settled === before[i]) await new Promise<void>((resolve) => t.settledWaiters.push(resolve));
            }),
          ),
          10_000,
          () => fail(`${label}: the outcome was never settled`),
        );
      } else {
        await Promise.all(targets.map((t) => p.answers[t.name]!.catch(() => undefined)));
      }
      if (holds && p.record !== undefined) {
        if (keepsOf(p.req.act)) settle(p.record, rec.fp, answers, p.req, p.n);
        else if (p.recovered) {
          // As a recovered run with no effect: abandoned again, its lease ended.
          records.set(p.record, { ...rec, leaseEnd: at + 1 });
          tick = true;
        } else records.delete(p.record);
      }
    };

    for (const s of steps) {
      if (tick) {
        tick = false;
        await options.advance(1);
        at += 1;
      }
      if (s.kind === 'advance') {
        // With the heartbeat, time only moves while nothing runs (a renewal would race the next request).
        if (config.heartbeat && live.length > 0) continue;
        trail.push(`advance ${s.ms}`);
        await options.advance(s.ms);
        at += s.ms;
        continue;
      }
      if (s.kind === 'finish' || s.kind === 'abort') {
        if (live.length === 0) continue;
        const p = live[s.pending % live.length]!;
        if (s.kind === 'finish') await finishPending(p);
        else if (!p.aborted) {
          trail.push(`abort #${p.id}`);
          p.aborted = true;
          cover('abort');
          for (const t of targets) p.abort[t.name]?.();
          await Promise.all(targets.map((t) => p.answers[t.name]!.then(ignore, ignore)));
        }
        continue;
      }
      let req: Req;
      if (s.kind === 'retry') {
        if (history.length === 0) continue;
        req = varied(history[history.length - 1 - (s.of % history.length)]!, s.vary, s.act);
      } else req = s.req;
      history.push(req);
      const { expected, id } = predict(req);
      cover(expected.kind === 'problem' ? `${expected.status} ${expected.code}` : `${expected.kind} ${req.act}`);
      const shown = {
        ...req,
        key: req.key.kind === 'field' ? req.key.field.slice(0, 8) : req.key.kind,
        trace: undefined,
      };
      const label = `send ${JSON.stringify(shown)}: ${expected.kind} ${'status' in expected ? expected.status : ''}`;
      trail.push(label);
      const sent = {} as Record<FrameworkName, string | undefined>;
      for (const t of targets) sent[t.name] = fieldFor(t, req);
      const gatesBefore = targets.map((t) => t.gates.length);
      const flights = targets.map((t) => sendOne(t, req, run));
      const recovered = expected.kind === 'execute' && id !== undefined && recordOf(id)?.state === 'running';
      if (expected.kind === 'execute') runs++;
      if (expected.kind === 'execute' && (req.act === 'hang' || req.act === 'hangThrow')) {
        const p: Pending = {
          id: ++hangs,
          answers: {},
          abort: {},
          open: {},
          sent,
          req,
          record: id,
          claim: ++claims,
          n: runs,
          recovered,
          aborted: false,
          expected,
        };
        // Each handler reaches its gate (or the server answers, where the model was wrong).
        await Promise.all(
          targets.map(async (t, i) => {
            const flight = flights[i]!;
            p.answers[t.name] = flight.answer;
            p.abort[t.name] = flight.abort;
            flight.answer.catch(ignore);
            const entered = new Promise<'entered'>((resolve) => {
              const poll = () => (t.gates.length > gatesBefore[i]! ? resolve('entered') : t.entered.push(poll));
              poll();
            });
            const first = await within(
              Promise.race([entered, flight.answer.then(() => 'answered' as const)]),
              10_000,
              () => fail(`${t.name}: neither ran nor answered: ${label}`),
            );
            if (first === 'answered') {
              const a = await flight.answer;
              throw new Error(
                fail(
                  `${t.name}: answered ${a.status} ${a.body.toString().slice(0, 200)}, where the model runs the hang: ${label}`,
                ),
              );
            }
            p.open[t.name] = t.gates[t.gates.length - 1]!;
          }),
        );
        if (id !== undefined) {
          records.set(id, { state: 'running', fp: fingerprintOf(req), claim: p.claim, leaseEnd: at + options.leaseMs });
        }
        live.push(p);
        continue;
      }
      const answers: Partial<Record<FrameworkName, Answer>> = {};
      for (const [i, t] of targets.entries())
        answers[t.name] = await within(flights[i]!.answer, 10_000, () => fail(`${t.name}: no answer: ${label}`));
      checkAnswers(label, expected, answers, req, sent, runs);
      if (expected.kind === 'execute' && id !== undefined) {
        claims++;
        if (expected.stored === 'yes' || expected.stored === 'unreplayable')
          settle(id, fingerprintOf(req), answers, req, runs);
        else if (recovered) {
          // A recovered run with no effect leaves the record as it found it: abandoned, its lease ended.
          const rec = recordOf(id) as Extract<Rec, { state: 'running' }>;
          records.set(id, { ...rec, claim: claims, leaseEnd: at + 1 });
          tick = true;
        } else records.delete(id);
        if (expected.echo === 'minted') {
          for (const t of targets) t.lastMinted = answers[t.name]!.headers['idempotency-key'] as string;
          mintedKey = id.split(' ').at(-1);
        }
      }
      for (const t of targets) expect(t.runs, fail(`${t.name}: handler runs`)).toBe(runs);
    }
    // Every hang ends: finished in order.
    while (live.length > 0) await finishPending(live[0]!);
    for (const t of targets) expect(t.runs, fail(`${t.name}: handler runs at the end`)).toBe(runs);
    // The sequence's records never meet the next one's: keys carry the run, and time moves past them.
    await options.advance(30 * 24 * HOUR);
  };

  const burst = async (requests: BurstReq[]) => {
    const config = configs[0]!;
    const targets = byConfig.get(config.name)!;
    const run = `${Date.now().toString(36)}b${(++sequenceNumber).toString(36)}`;
    const toReq = (b: BurstReq): Req => ({
      user: b.user,
      key: { kind: 'field', field: b.key },
      endpoint: 0,
      act: b.act,
      amount: b.amount,
      spaced: false,
      query: '',
      version: undefined,
      trace: 'burst',
      oversized: false,
    });
    const shown = JSON.stringify(requests);
    await Promise.all(
      targets.map(async (t) => {
        t.runs = 0;
        const gatesBefore = t.gates.length;
        let answered = 0;
        const flights = requests.map((b) => {
          const answer = sendOne(t, toReq(b), run).answer;
          void answer.then(() => {
            answered++;
            for (const w of t.entered.splice(0)) w();
          }, ignore);
          return answer;
        });
        // Every request ran (at its gate, or answered) or was answered: then the hangs may go.
        await within(
          (async () => {
            while (answered + t.gates.length - gatesBefore < requests.length)
              await new Promise<void>((resolve) => t.entered.push(resolve));
          })(),
          15_000,
          () => `${t.name}: burst never settled: ${shown}`,
        );
        for (const g of t.gates.splice(gatesBefore)) g();
        const answers = await within(Promise.all(flights), 15_000, () => `${t.name}: burst unanswered: ${shown}`);
        // By record: the one run, and what every other request got.
        const ids = new Set(requests.map((b) => `${b.user} ${b.key}`));
        expect(t.runs, `${t.name}: one run per record: ${shown}`).toBe(ids.size);
        for (const id of ids) {
          const mine = requests.flatMap((b, i) => (`${b.user} ${b.key}` === id ? [{ b, a: answers[i]! }] : []));
          const runs = mine.filter(({ a }) => a.status === 201 && a.headers['idempotent-replayed'] === undefined);
          expect(runs.length, `${t.name}: ${id} ran once: ${shown}`).toBe(1);
          const winner = runs[0]!;
          const fp = (b: BurstReq) => `${b.act} ${b.amount}`;
          for (const { b, a } of mine) {
            if (a === winner.a) continue;
            const where = `${t.name}: ${id} ${fp(b)} (ran: ${fp(winner.b)}): ${shown}`;
            if (a.status === 409) {
              expect(a.headers['retry-after'], where).toBe('1');
              continue;
            }
            if (fp(b) === fp(winner.b)) {
              expect({ status: a.status, replayed: a.headers['idempotent-replayed'] }, where).toEqual({
                status: 201,
                replayed: 'true',
              });
              expect(a.body.toString('latin1'), where).toBe(winner.a.body.toString('latin1'));
            } else {
              expect({ status: a.status, code: JSON.parse(a.body.toString()).code }, where).toEqual({
                status: 422,
                code: 'fingerprint_mismatch',
              });
            }
          }
          // Afterwards, each request again: the replay of the run, or 422.
          for (const { b } of mine) {
            const again = await sendOne(t, toReq(b), run).answer;
            const where = `${t.name}: ${id} ${fp(b)} again (ran: ${fp(winner.b)}): ${shown}`;
            if (fp(b) === fp(winner.b)) {
              expect(again.headers['idempotent-replayed'], where).toBe('true');
              expect(again.body.toString('latin1'), where).toBe(winner.a.body.toString('latin1'));
            } else expect(again.status, where).toBe(422);
          }
        }
        expect(t.runs, `${t.name}: no run after the burst: ${shown}`).toBe(ids.size);
      }),
    );
    await options.advance(30 * 24 * HOUR);
  };

  const takeoverBurst = async (same: number, other: number) => {
    const config = configs[1]!;
    const targets = byConfig.get(config.name)!;
    const run = `${Date.now().toString(36)}t${(++sequenceNumber).toString(36)}`;
    const base: Req = {
      user: 'alice',
      key: { kind: 'field', field: 'k1' },
      endpoint: 0,
      act: 'hang',
      amount: 1,
      spaced: false,
      query: '',
      version: undefined,
      trace: 'takeover',
      oversized: false,
    };
    const shown = `${same} same, ${other} other`;
    // The first attempt, on every framework, each at its gate.
    const firsts = await Promise.all(
      targets.map(async (t) => {
        t.runs = 0;
        const gatesBefore = t.gates.length;
        const answer = sendOne(t, base, run).answer;
        answer.catch(ignore);
        await within(
          (async () => {
            while (t.gates.length === gatesBefore) await new Promise<void>((resolve) => t.entered.push(resolve));
          })(),
          10_000,
          () => `${t.name}: the first attempt never ran`,
        );
        return { answer, gate: t.gates[t.gates.length - 1]! };
      }),
    );
    await options.advance(options.leaseMs + 1);
    await Promise.all(
      targets.map(async (t, i) => {
        const gatesBefore = t.gates.length;
        let answered = 0;
        const requests = [
          ...Array.from({ length: same }, () => base),
          ...Array.from({ length: other }, () => ({ ...base, amount: 2 as const })),
        ];
        const flights = requests.map((req) => {
          const answer = sendOne(t, req, run).answer;
          void answer.then(() => {
            answered++;
            for (const w of t.entered.splice(0)) w();
          }, ignore);
          return answer;
        });
        await within(
          (async () => {
            while (answered + t.gates.length - gatesBefore < requests.length)
              await new Promise<void>((resolve) => t.entered.push(resolve));
          })(),
          15_000,
          () => `${t.name}: takeover burst never settled: ${shown}`,
        );
        const entered = t.gates.length - gatesBefore;
        expect(entered, `${t.name}: one takeover: ${shown}`).toBe(1);
        expect(t.runs, `${t.name}: runs: ${shown}`).toBe(2);
        // The late finisher first: fenced, its answer served as written.
        const first = firsts[i]!;
        first.gate();
        const late = await within(first.answer, 10_000, () => `${t.name}: the late finisher never answered`);
        expect({ status: late.status, replayed: late.headers['idempotent-replayed'] }, t.name).toEqual({
          status: 201,
          replayed: undefined,
        });
        for (const g of t.gates.splice(gatesBefore)) g();
        const answers = await within(Promise.all(flights), 15_000, () => `${t.name}: takeover burst unanswered`);
        const ran = answers.filter((a) => a.status === 201);
        expect(ran.length, `${t.name}: one answer of a run: ${shown}`).toBe(1);
        for (const [j, a] of answers.entries()) {
          if (a === ran[0]) continue;
          const where = `${t.name}: request ${j} (${j < same ? 'same' : 'other'} body): ${shown}`;
          if (j < same) expect(a.status, where).toBe(409);
          else expect([409, 422], where).toContain(a.status);
        }
        const again = await sendOne(t, base, run).answer;
        expect(again.headers['idempotent-replayed'], `${t.name}: replayed`).toBe('true');
        expect(again.body.toString(), `${t.name}: the takeover's answer`).toBe(ran[0]!.body.toString());
        expect(again.body.toString(), `${t.name}: not the late finisher's`).not.toBe(late.body.toString());
        expect((await sendOne(t, { ...base, amount: 2 }, run).answer).status, t.name).toBe(422);
        expect(t.runs, `${t.name}: runs at the end`).toBe(2);
      }),
    );
    await options.advance(30 * 24 * HOUR);
  };

  return {
    burst,
    takeoverBurst,
    play: (config, steps) => play(config, steps),
    check: async (config) => {
      let sequences = 0;
      let requests = 0;
      const coverage: Record<string, number> = {};
      await fc.assert(
        fc.asyncProperty(
          fc.array(stepArbitrary(options.leaseMs, true), { minLength: 5, maxLength: 30, size: 'max' }),
          async (steps) => {
            sequences++;
            requests += steps.filter((s) => s.kind === 'send' || s.kind === 'retry').length;
            await play(config, steps, coverage);
          },
        ),
        {
          numRuns: options.numRuns,
          ...(options.seed !== undefined ? { seed: options.seed, path: options.path } : {}),
          endOnFailure: true,
        },
      );
      return { sequences, requests, coverage };
    },
    close,
  };
}
