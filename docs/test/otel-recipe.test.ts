// Runs the OpenTelemetry recipe of docs/operations.md (the block titled telemetry.ts) as it is on the
// page: the block is compiled to JavaScript and imported, a recording MeterProvider and
// TracerProvider are registered through @opentelemetry/api, and a real engine and a real guard
// report their events to the recipe. Counters, histograms, spans and log lines must move.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import {
  createHttpIdempotency,
  createIdempotency,
  type IdempotencyEvent,
  memoryStore,
  type Store,
  StoreUnavailableError,
} from '@idem/core';
import { createGuard, type GuardEvent } from '@idem/guard';
import {
  type Attributes,
  type Counter,
  createNoopMeter,
  type Histogram,
  type Meter,
  metrics,
  type Span,
  type SpanOptions,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { SignJWT } from 'jose';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');
const recipe = /^```ts title="telemetry\.ts"\n([\s\S]*?)^```\s*$/m.exec(page)?.[1];

interface Point {
  name: string;
  value: number;
  attributes: Attributes;
}
interface RecordedSpan {
  name: string;
  startTime: unknown;
  endTime: unknown;
  attributes: Attributes;
  error: boolean;
  exceptions: unknown[];
}

const counted: Point[] = [];
const histograms: Point[] = [];
const spans: RecordedSpan[] = [];
const logs: Array<Record<string, unknown>> = [];

// A meter that records what the recipe adds; everything it does not use stays the no-op meter's.
const recordingMeter: Meter = Object.assign(Object.create(createNoopMeter()) as Meter, {
  createCounter(name: string): Counter {
    return { add: (value: number, attributes: Attributes = {}) => void counted.push({ name, value, attributes }) };
  },
  createHistogram(name: string): Histogram {
    return {
      record: (value: number, attributes: Attributes = {}) => void histograms.push({ name, value, attributes }),
    };
  },
});

const recordingTracer = {
  startSpan(name: string, options: SpanOptions = {}): Span {
    const span: RecordedSpan = {
      name,
      startTime: options.startTime,
      endTime: undefined,
      attributes: { ...options.attributes },
      error: false,
      exceptions: [],
    };
    spans.push(span);
    const handle = {
      recordException: (exception: unknown) => void span.exceptions.push(exception),
      setStatus: (status: { code: number }) => {
        span.error = status.code === 2;
        return handle;
      },
      setAttribute: (key: string, value: unknown) => {
        span.attributes[key] = value as never;
        return handle;
      },
      end: (endTime?: unknown) => {
        span.endTime = endTime;
      },
    };
    return handle as unknown as Span;
  },
} as unknown as Tracer;

interface Telemetry {
  onIdempotencyEvent(event: IdempotencyEvent): void;
  onGuardEvent(event: GuardEvent): void;
}
let telemetry: Telemetry;

const sum = (name: string, match: Attributes = {}) =>
  counted
    .filter((p) => p.name === name && Object.entries(match).every(([k, v]) => p.attributes[k] === v))
    .reduce((total, p) => total + p.value, 0);

beforeAll(async () => {
  expect(recipe, 'docs/operations.md has a ```ts title="telemetry.ts" block').toBeDefined();
  expect(metrics.setGlobalMeterProvider({ getMeter: () => recordingMeter })).toBe(true);
  expect(trace.setGlobalTracerProvider({ getTracer: () => recordingTracer })).toBe(true);
  // Compiled next to the workspace's node_modules, so its bare imports resolve as an app's would.
  const dir = join(root, 'node_modules', '.cache', 'idem-otel-recipe');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `telemetry-${process.pid}.mjs`);
  const js = ts.transpileModule(recipe as string, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, verbatimModuleSyntax: true },
  }).outputText;
  writeFileSync(file, js);
  const module = (await import(pathToFileURL(file).href)) as {
    createIdemTelemetry(log?: (line: Record<string, unknown>) => void): Telemetry;
  };
  telemetry = module.createIdemTelemetry((line) => logs.push(line));
});

afterAll(() => {
  metrics.disable();
  trace.disable();
});

describe('the OpenTelemetry recipe of docs/operations.md', () => {
  it('counts claims, completions, replays and mismatches of a real engine, with spans', async () => {
    const engine = createIdempotency({ store: memoryStore(), onEvent: (e) => telemetry.onIdempotencyEvent(e) });
    const input = { key: 'secret-key-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'f1' };
    const started = await engine.begin(input);
    expect(started.kind).toBe('execute');
    if (started.kind !== 'execute') return;
    await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array([1]) });
    expect((await engine.begin(input)).kind).toBe('replay');
    expect((await engine.begin({ ...input, fingerprint: 'f2' })).kind).toBe('reject');

    const op = { 'idem.operation': 'POST /charges' };
    expect(sum('idem.requests', { ...op, 'idem.result': 'claim' })).toBe(1);
    expect(sum('idem.requests', { ...op, 'idem.result': 'replay' })).toBe(1);
    expect(sum('idem.requests', { ...op, 'idem.result': 'mismatch' })).toBe(1);
    expect(sum('idem.outcomes', { ...op, 'idem.outcome': 'stored' })).toBe(1);
    expect(histograms.filter((h) => h.name === 'idem.begin.duration')).toHaveLength(3);
    expect(histograms.filter((h) => h.name === 'idem.execution.duration')).toHaveLength(1);
    expect(spans.map((s) => s.name)).toEqual(['idem.begin', 'idem.complete', 'idem.begin', 'idem.begin']);
    for (const span of spans) expect(span.endTime).toEqual(expect.any(Number));
    expect(logs).toEqual([
      expect.objectContaining({ level: 'info', msg: 'idempotency key reused with another request' }),
    ]);
    // Neither the key nor the caller reaches a metric, a span or a log line.
    const everything = JSON.stringify({ counted, histograms, spans, logs });
    expect(everything).not.toContain('secret-key-1');
    expect(everything).not.toContain('user:alice');
  });

  // Was wrong (audit of the operator's day two): `lease-lost` and `response-not-stored` were counted
  // in idem.outcomes beside the execution's own end, so one execution whose lease was lost and whose
  // answer was then stored counted twice there (lease-lost and stored), and ratios were off.
  it('counts each execution once in idem.outcomes; a lost lease and an unstored response on counters of their own', async () => {
    vi.useFakeTimers();
    try {
      const engine = createIdempotency({
        store: memoryStore({ now: () => Date.now() }),
        lease: '1s',
        maxExecution: '3s',
        now: () => Date.now(),
        onEvent: (e) => telemetry.onIdempotencyEvent(e),
      });
      const started = await engine.begin({ key: 'k-late', scope: 's', operation: 'POST /late', fingerprint: 'f' });
      if (started.kind !== 'execute') throw new Error('expected execute');
      await vi.advanceTimersByTimeAsync(3_500);
      expect(started.lease.signal.aborted).toBe(true);
      await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array([1]) });
    } finally {
      vi.useRealTimers();
    }
    const op = { 'idem.operation': 'POST /late' };
    expect(sum('idem.outcomes', op)).toBe(1);
    expect(sum('idem.outcomes', { ...op, 'idem.outcome': 'stored' })).toBe(1);
    expect(sum('idem.leases.lost', { ...op, 'idem.reason': 'max-execution' })).toBe(1);

    const served = { at: 0, id: 'r', operation: 'POST /big', status: 201 } as const;
    telemetry.onIdempotencyEvent({ type: 'response-not-stored', reason: 'too-large', ...served });
    expect(sum('idem.outcomes', { 'idem.operation': 'POST /big' })).toBe(0);
    expect(sum('idem.responses.unstored', { 'idem.operation': 'POST /big', 'idem.reason': 'too-large' })).toBe(1);
  });

  it('counts store errors, marks their span as an error, and logs a warning', async () => {
    const down: Store = {
      ...memoryStore(),
      claim: () => Promise.reject(new StoreUnavailableError('Redis claim failed')),
    };
    const engine = createIdempotency({ store: down, onEvent: (e) => telemetry.onIdempotencyEvent(e) });
    const result = await engine.begin({ key: 'k', scope: 's', operation: 'POST /orders', fingerprint: 'f' });
    expect(result.kind).toBe('reject');
    expect(sum('idem.store.errors', { 'idem.operation': 'POST /orders', 'idem.phase': 'claim' })).toBe(1);
    const span = spans.find((s) => s.name === 'idem.store.claim');
    expect(span?.error).toBe(true);
    expect(span?.exceptions).toHaveLength(1);
    expect(logs.at(-1)).toMatchObject({
      level: 'warn',
      msg: 'idempotency store error',
      phase: 'claim',
      error: { name: 'StoreUnavailableError', message: 'Redis claim failed' },
    });
  });

  it('counts a completion the store refused as a store error of phase complete, with a warning (research case 13)', async () => {
    const store = memoryStore();
    const refusing: Store = {
      ...store,
      complete: () => Promise.reject(new StoreUnavailableError('Redis write failed')),
    };
    const engine = createIdempotency({ store: refusing, onEvent: (e) => telemetry.onIdempotencyEvent(e) });
    const started = await engine.begin({ key: 'k13', scope: 's', operation: 'POST /orders', fingerprint: 'f' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    const before = sum('idem.store.errors', { 'idem.operation': 'POST /orders', 'idem.phase': 'complete' });
    const result = await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array() });
    expect(result).toMatchObject({ ok: false, reason: 'store-error' });
    expect(sum('idem.store.errors', { 'idem.operation': 'POST /orders', 'idem.phase': 'complete' })).toBe(before + 1);
    expect(logs.at(-1)).toMatchObject({ level: 'warn', msg: 'idempotency store error', phase: 'complete' });
  });

  // Was wrong (audit of a support engineer's day with one key): the warnings for a response served
  // but not stored, a failing storeOutcome and a store error carried no record id, so the engineer
  // who computed `recordId(scope, operation, key)` from a ticket found none of them (a `500
  // response_not_replayable` ticket most of all); only mismatch and lease-lost lines had it.
  it('names the record in every log line about one, so the record id of a ticket finds them all', async () => {
    const store = memoryStore();
    const failing: Store = {
      ...store,
      complete: () => Promise.reject(new StoreUnavailableError('Redis write failed')),
    };
    const engine = createIdempotency({
      store: failing,
      storeOutcome: () => {
        throw new Error('policy bug');
      },
      onEvent: (e) => telemetry.onIdempotencyEvent(e),
    });
    const started = await engine.begin({ key: 'k-ticket', scope: 's', operation: 'POST /tickets', fingerprint: 'f' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    const from = logs.length;
    await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array() });
    telemetry.onIdempotencyEvent({
      type: 'response-not-stored',
      reason: 'too-large',
      id: started.lease.id,
      operation: 'POST /tickets',
      status: 201,
      at: 0,
    });
    const lines = logs.slice(from);
    expect(lines.map((line) => line.msg)).toEqual(
      expect.arrayContaining([
        'storeOutcome failed; the outcome was stored',
        'idempotency store error',
        'response served but not stored',
      ]),
    );
    for (const line of lines) expect(line).toMatchObject({ record: started.lease.id });
  });

  // Was wrong (same audit): a claim that took a crashed attempt's key over (`recovered: true`, "an
  // operation that may have run twice", the events table says to alert on them) was counted as any
  // claim and logged nowhere, so neither the alert nor a "charged twice" ticket could find it.
  it('counts a claim that took over a crashed attempt apart, and logs it with its record', async () => {
    let t = 1_000_000;
    const now = () => t;
    const engine = createIdempotency({
      store: memoryStore({ now }),
      now,
      lease: '1s',
      heartbeat: false,
      onEvent: (e) => telemetry.onIdempotencyEvent(e),
    });
    const input = { key: 'k-crash', scope: 's', operation: 'POST /payouts', fingerprint: 'f' };
    const crashed = await engine.begin(input);
    if (crashed.kind !== 'execute') throw new Error('expected execute');
    t += 2_000;
    const recovered = await engine.begin(input);
    if (recovered.kind !== 'execute') throw new Error('expected execute');
    expect(recovered.lease.recovered).toBe(true);
    const op = { 'idem.operation': 'POST /payouts', 'idem.result': 'claim' };
    expect(sum('idem.requests', op)).toBe(2);
    expect(sum('idem.requests', { ...op, 'idem.recovered': true })).toBe(1);
    expect(logs.at(-1)).toMatchObject({ level: 'warn', record: recovered.lease.id, operation: 'POST /payouts' });
  });

  // Was wrong (same audit): a 5xx the outcome policy released ('stripe', 'success', or a function)
  // left no trace of its record: counted under idem.outcomes only. Its retry runs the operation
  // again, which is the whole answer to a "charged twice" ticket after an outage, and the engineer
  // holding the record id found nothing. A released 4xx (401, 429) stays unlogged: it is routine.
  it('logs a released 5xx with its record (its retry runs again), not a released 4xx', async () => {
    const engine = createIdempotency({
      store: memoryStore(),
      storeOutcome: 'success',
      onEvent: (e) => telemetry.onIdempotencyEvent(e),
    });
    const from = logs.length;
    const run = async (key: string, status: number) => {
      const started = await engine.begin({ key, scope: 's', operation: 'POST /refunds', fingerprint: 'f' });
      if (started.kind !== 'execute') throw new Error('expected execute');
      await engine.complete(started.lease, { status, headers: {}, body: new Uint8Array() });
      return started.lease.id;
    };
    await run('k-429', 429);
    const id = await run('k-503', 503);
    expect(sum('idem.outcomes', { 'idem.operation': 'POST /refunds', 'idem.outcome': 'not-stored' })).toBe(2);
    expect(logs.slice(from)).toEqual([
      expect.objectContaining({ level: 'warn', record: id, status: 503, operation: 'POST /refunds' }),
    ]);
  });

  // Was wrong (audit of docs/operations.md against the events): a key the outcome policy released
  // (or a handler's `release()`) emits `release` and then `not-stored` (engine.ts: "the same events
  // as complete(): `complete` with the status, or `release` and `not-stored`"), and the recipe
  // counted both in idem.outcomes, so each such execution counted twice there and a ratio of
  // not-stored (or released) executions to stored ones, after an outage, came out twice too high.
  it('counts an execution the policy released once in idem.outcomes (release then not-stored)', async () => {
    const engine = createIdempotency({
      store: memoryStore(),
      storeOutcome: 'success',
      onEvent: (e) => telemetry.onIdempotencyEvent(e),
    });
    const started = await engine.begin({ key: 'k-out', scope: 's', operation: 'POST /outcomes', fingerprint: 'f' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    const result = await engine.complete(started.lease, { status: 503, headers: {}, body: new Uint8Array() });
    expect(result).toEqual({ ok: true, stored: false });
    expect(sum('idem.outcomes', { 'idem.operation': 'POST /outcomes' })).toBe(1);
    expect(sum('idem.outcomes', { 'idem.operation': 'POST /outcomes', 'idem.outcome': 'not-stored' })).toBe(1);
    // Every key released is still counted, once, on a counter of its own.
    expect(sum('idem.releases', { 'idem.operation': 'POST /outcomes' })).toBe(1);
  });

  it('counts refused requests by code, without a log line (a misbehaving client would fill the log)', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), onEvent: (e) => telemetry.onIdempotencyEvent(e) });
    const logged = logs.length;
    const request = {
      method: 'POST',
      route: '/refunds',
      path: '/refunds',
      query: '',
      scope: 'user:alice',
      contentType: undefined,
      body: undefined,
    };
    expect((await http.begin({ ...request, keyHeader: 'a, b' })).kind).toBe('respond');
    expect((await http.begin({ ...request, keyHeader: undefined })).kind).toBe('respond');
    expect((await http.begin({ ...request, keyHeader: 'k', scope: undefined })).kind).toBe('respond');
    const refused = { 'idem.operation': 'POST /refunds', 'idem.result': 'refused' };
    expect(sum('idem.requests', { ...refused, 'idem.code': 'key_invalid' })).toBe(1);
    expect(sum('idem.requests', { ...refused, 'idem.code': 'key_missing' })).toBe(1);
    expect(sum('idem.requests', { ...refused, 'idem.code': 'scope_missing' })).toBe(1);
    expect(logs.length).toBe(logged);
  });

  it('counts guard results of a real guard by result and code', async () => {
    const secret = 'a-test-secret-that-is-long-enough-for-hs256';
    const guard = createGuard({
      audience: 'https://api.test',
      issuers: [{ issuer: 'https://id.test', secret }],
      onEvent: (e) => telemetry.onGuardEvent(e),
    });
    const refused = await guard.authenticate({ headers: {}, url: '/orders' });
    expect(refused.ok).toBe(false);
    const token = await new SignJWT({})
      .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
      .setIssuer('https://id.test')
      .setAudience('https://api.test')
      .setSubject('alice')
      .setExpirationTime('5m')
      .sign(new TextEncoder().encode(secret));
    const accepted = await guard.authenticate({ headers: { authorization: `Bearer ${token}` }, url: '/orders' });
    expect(accepted.ok).toBe(true);
    expect(sum('idem.guard.requests', { 'idem.guard.result': 'rejected', 'idem.guard.code': 'token_missing' })).toBe(1);
    expect(
      sum('idem.guard.requests', { 'idem.guard.result': 'authenticated', 'idem.guard.issuer': 'https://id.test' }),
    ).toBe(1);
    expect(JSON.stringify(counted)).not.toContain(token);
  });

  it('counts stale JWKS answers without a log line each (an outage would flood the log)', () => {
    const before = logs.length;
    for (let i = 0; i < 3; i++) {
      telemetry.onGuardEvent({ type: 'jwks-stale', uri: 'https://id.test/jwks', ageMs: 1_000, at: i });
    }
    expect(sum('idem.guard.jwks.problems', { 'idem.guard.problem': 'jwks-stale' })).toBe(3);
    expect(logs.length).toBe(before);
  });
});
