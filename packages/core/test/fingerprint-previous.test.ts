// `fingerprint.previous`: a rolling change of what the fingerprint covers (`exclude`, `headers`).
// Records made under the old settings hold the old fingerprint; without `previous`, every retry of
// such a request is refused 422 by the new settings for the whole retention, though it was sent byte
// for byte the same. With the old settings in `previous`, a request whose fingerprint under one of
// them is the stored one is the same request: replayed, taken over or told 409 as for a match.
import { describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import * as fingerprints from '../src/fingerprint.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpFingerprintOptions } from '../src/http-options.js';
import type { HttpRequestInfo } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store, StoredResponse } from '../src/store.js';

// A pass-through spy: counts how many fingerprints the HTTP layer computes, so a test can tell that
// the previous settings cost nothing on a match.
vi.mock('../src/fingerprint.js', async (original) => {
  const real = await original<typeof import('../src/fingerprint.js')>();
  return { ...real, fingerprintRequest: vi.fn(real.fingerprintRequest) };
});
const fingerprintCalls = () => vi.mocked(fingerprints.fingerprintRequest).mock.calls.length;

// A client timestamp in the body and an API version header: what `exclude` and `headers` are for.
const charge = (overrides: Partial<HttpRequestInfo> = {}): HttpRequestInfo => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: 'application/json',
  keyHeader: 'k-1',
  body: Buffer.from('{"amount":1000,"sentAt":"2026-12-04T10:00:00Z"}'),
  scope: 'caller',
  headers: { 'api-version': '2026-01' },
  ...overrides,
});
// The same charge with another amount: really another request.
const otherCharge = (overrides: Partial<HttpRequestInfo> = {}) =>
  charge({ body: Buffer.from('{"amount":2000,"sentAt":"2026-12-04T10:00:00Z"}'), ...overrides });

const response: StoredResponse = {
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from('{"id":"ch_1"}'),
};

/** One store and one clock, and a server of each configuration on them. */
function deploy(storeOf: (now: () => number) => Store = (now) => memoryStore({ now })) {
  let t = 1_700_000_000_000;
  const now = () => t;
  const store = storeOf(now);
  const events: IdempotencyEvent[] = [];
  const server = (fingerprint: HttpFingerprintOptions | undefined, extra: Record<string, unknown> = {}) =>
    createHttpIdempotency({
      store,
      now,
      heartbeat: false,
      onEvent: (event) => events.push(event),
      ...(fingerprint === undefined ? {} : { fingerprint }),
      ...extra,
    });
  return { store, server, events, advance: (ms: number) => (t += ms) };
}

type Server = ReturnType<ReturnType<typeof deploy>['server']>;

/** Runs `request` on `server` and stores its response: the first request, made under the old settings. */
async function firstRun(server: Server, request: HttpRequestInfo = charge()) {
  const started = await server.begin(request);
  if (started.kind !== 'execute') throw new Error(`expected the first request to run, got ${started.kind}`);
  expect(await server.engine.complete(started.lease, response)).toEqual({ ok: true, stored: true });
  return started;
}

/** What a request got: `run`, `replayed <body>` or `<status> <code>`. */
async function answer(server: Server, request: HttpRequestInfo = charge()) {
  const started = await server.begin(request);
  if (started.kind === 'execute') return 'run';
  if (started.kind === 'pass') return 'pass';
  const { status, headers, body } = started.response;
  const text = Buffer.from(body).toString();
  if (headers['idempotent-replayed'] === 'true') return `replayed ${text}`;
  return `${status} ${(JSON.parse(text) as { code: string }).code}`;
}

// The old settings, the new ones, and the new ones with the old in `previous`.
const rollouts: [string, HttpFingerprintOptions | undefined, HttpFingerprintOptions][] = [
  ['exclude gains /sentAt', undefined, { exclude: ['/sentAt'] }],
  ['headers gains api-version', undefined, { headers: ['api-version'] }],
  ['headers loses api-version', { headers: ['api-version'] }, {}],
  ['exclude loses /sentAt, headers gains api-version', { exclude: ['/sentAt'] }, { headers: ['API-Version'] }],
];

describe('fingerprint.previous: a record made under earlier settings', () => {
  it.each(rollouts)(
    '%s: without previous, the very same request is refused 422 (why previous exists)',
    async (_name, old, next) => {
      const { server } = deploy();
      await firstRun(server(old));
      expect(await answer(server(next))).toBe('422 fingerprint_mismatch');
    },
  );

  it.each(rollouts)(
    '%s: with the old settings in previous, the very same request is replayed',
    async (_name, old, next) => {
      const { server } = deploy();
      await firstRun(server(old));
      const updated = server({ ...next, previous: [old ?? {}] });
      expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
      // Again: nothing was rewritten, and the old settings still replay it too.
      expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
      expect(await answer(server(old))).toBe('replayed {"id":"ch_1"}');
    },
  );

  it.each(rollouts)('%s: a really different request is still refused 422', async (_name, old, next) => {
    const { server } = deploy();
    await firstRun(server(old));
    expect(await answer(server({ ...next, previous: [old ?? {}] }), otherCharge())).toBe('422 fingerprint_mismatch');
  });

  it('another API version is another request under settings that name the header, now or before', async () => {
    const { server } = deploy();
    await firstRun(server({ headers: ['api-version'] }));
    const later = charge({ headers: { 'api-version': '2026-02' } });
    expect(await answer(server({ previous: [{ headers: ['api-version'] }] }), later)).toBe('422 fingerprint_mismatch');
  });

  it('any one of several previous settings will do, in any order', async () => {
    const { server } = deploy();
    await firstRun(server({ headers: ['api-version'] }));
    const updated = server({
      exclude: ['/sentAt'],
      previous: [{ exclude: ['/sentAt'] }, { headers: ['api-version'] }, {}],
    });
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
  });

  it('a retry that changed a field only the new settings leave out is refused, as the old settings would', async () => {
    // The record holds the old fingerprint, of the body with its timestamp: under the old settings
    // another timestamp was another request, and the retry is judged by them.
    const { server } = deploy();
    await firstRun(server(undefined));
    const resent = charge({ body: Buffer.from('{"amount":1000,"sentAt":"2026-12-04T10:00:05Z"}') });
    expect(await answer(server({ exclude: ['/sentAt'], previous: [{}] }), resent)).toBe('422 fingerprint_mismatch');
  });

  it('honours mismatchStatus for a really different request', async () => {
    const { server } = deploy();
    await firstRun(server(undefined));
    const updated = server({ exclude: ['/sentAt'], previous: [{}] }, { mismatchStatus: 400 });
    expect(await answer(updated, otherCharge())).toBe('400 idempotency_error');
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
  });
});

describe('fingerprint.previous: a request still in progress, or abandoned, under earlier settings', () => {
  it('in progress: the same request gets 409 in_progress, as for a match', async () => {
    const { server } = deploy();
    const first = await server(undefined).begin(charge());
    expect(first.kind).toBe('execute');
    expect(await answer(server({ exclude: ['/sentAt'], previous: [{}] }))).toBe('409 in_progress');
  });

  it('in progress with wait: the same request waits for the outcome and replays it; another gets 422', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout'] });
    try {
      const { server } = deploy();
      const old = server(undefined);
      const first = await old.begin(charge());
      if (first.kind !== 'execute') throw new Error('expected execute');
      const updated = server({ exclude: ['/sentAt'], previous: [{}] }, { wait: '2s' });
      const same = answer(updated);
      const other = answer(updated, otherCharge({ keyHeader: 'k-1' }));
      await vi.advanceTimersByTimeAsync(50);
      await old.engine.complete(first.lease, response);
      await vi.advanceTimersByTimeAsync(500);
      expect(await same).toBe('replayed {"id":"ch_1"}');
      expect(await other).toBe('422 fingerprint_mismatch');
    } finally {
      vi.useRealTimers();
    }
  });

  it('abandoned: the same request takes the key over and keeps the record fingerprint the old settings match', async () => {
    const { server, advance } = deploy();
    const old = server(undefined, { lease: '1s' });
    const crashed = await old.begin(charge());
    expect(crashed.kind).toBe('execute');
    advance(1_001);
    const updated = server({ exclude: ['/sentAt'], previous: [{}] }, { lease: '1s' });
    // Another request is refused: the crashed attempt may have had its effect.
    expect(await answer(updated, otherCharge())).toBe('422 fingerprint_mismatch');
    const taken = await updated.begin(charge());
    if (taken.kind !== 'execute') throw new Error(`expected a takeover, got ${taken.kind}`);
    expect(taken.lease.recovered).toBe(true);
    await updated.engine.complete(taken.lease, response);
    // The record still holds the old fingerprint: an instance of the old settings replays it too.
    expect(await answer(old)).toBe('replayed {"id":"ch_1"}');
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
  });

  it('abandoned: without previous, the same request is refused 422', async () => {
    const { server, advance } = deploy();
    expect((await server(undefined, { lease: '1s' }).begin(charge())).kind).toBe('execute');
    advance(1_001);
    expect(await answer(server({ exclude: ['/sentAt'] }, { lease: '1s' }))).toBe('422 fingerprint_mismatch');
  });
});

// A memory store dressed as a shared one (not `inProcess`), so the engine keeps a replay cache.
function shared(now: () => number) {
  const inner = memoryStore({ now });
  const calls = { get: 0, claim: 0 };
  const store: Store = {
    claim: (input) => {
      calls.claim++;
      return Promise.resolve(inner.claim(input));
    },
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => {
      calls.get++;
      return Promise.resolve(inner.get(id));
    },
  };
  return Object.assign(store, { calls });
}

describe('fingerprint.previous: the replay cache', () => {
  it('a record cached by the new settings is replayed from the cache for the same request, 422 for another', async () => {
    let store: ReturnType<typeof shared> | undefined;
    const { server, events } = deploy((now) => {
      store = shared(now);
      return store;
    });
    await firstRun(server(undefined));
    const updated = server({ exclude: ['/sentAt'], previous: [{}] }, { replayCache: { ttl: '1s' } });
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
    const claims = store?.calls.claim;
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
    expect(await answer(updated, otherCharge())).toBe('422 fingerprint_mismatch');
    // Both answered from the cache: no store call.
    expect(store?.calls.claim).toBe(claims);
    const replays = events.filter((event) => event.type === 'replay');
    expect(replays.at(-1)).toMatchObject({ cached: true });
  });
});

describe('fingerprint.previous costs nothing when the fingerprint matches', () => {
  it('computes the previous fingerprints only on a mismatch, once per request', async () => {
    const { server } = deploy();
    const updated = server({
      exclude: ['/sentAt'],
      previous: [{}, { headers: ['api-version'] }],
    });
    let before = fingerprintCalls();
    await firstRun(updated);
    expect(fingerprintCalls() - before).toBe(1);
    before = fingerprintCalls();
    expect(await answer(updated)).toBe('replayed {"id":"ch_1"}');
    expect(fingerprintCalls() - before).toBe(1);
    // A mismatch: the current fingerprint, then one per previous setting.
    before = fingerprintCalls();
    expect(await answer(updated, otherCharge())).toBe('422 fingerprint_mismatch');
    expect(fingerprintCalls() - before).toBe(3);
  });

  it('the engine asks alternateFingerprints only on a mismatch', async () => {
    const engine = createIdempotency({ store: memoryStore(), heartbeat: false });
    const request = { key: 'k-1', scope: 'caller', operation: 'POST /charges' };
    const first = await engine.begin({ ...request, fingerprint: 'a'.repeat(64) });
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, response);
    const alternates = vi.fn(() => ['a'.repeat(64)]);
    expect(
      (await engine.begin({ ...request, fingerprint: 'a'.repeat(64), alternateFingerprints: alternates })).kind,
    ).toBe('replay');
    expect(alternates).not.toHaveBeenCalled();
    expect(
      (await engine.begin({ ...request, fingerprint: 'b'.repeat(64), alternateFingerprints: alternates })).kind,
    ).toBe('replay');
    expect(alternates).toHaveBeenCalledTimes(1);
    const none = vi.fn(() => ['c'.repeat(64)]);
    const refused = await engine.begin({ ...request, fingerprint: 'b'.repeat(64), alternateFingerprints: none });
    expect(refused.kind === 'reject' && refused.error.code).toBe('fingerprint_mismatch');
    expect(none).toHaveBeenCalledTimes(1);
  });

  it("the engine never takes an empty alternate (no fingerprint) for a match, nor a callback's undefined", async () => {
    const engine = createIdempotency({ store: memoryStore(), heartbeat: false });
    const request = { key: 'k-1', scope: 'caller', operation: 'POST /charges' };
    const first = await engine.begin({ ...request, fingerprint: 'a'.repeat(64) });
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, response);
    for (const alternates of [() => [''], () => undefined, () => []]) {
      const refused = await engine.begin({
        ...request,
        fingerprint: 'b'.repeat(64),
        alternateFingerprints: alternates,
      });
      expect(refused.kind === 'reject' && refused.error.code).toBe('fingerprint_mismatch');
    }
  });

  it('the engine refuses an alternateFingerprints that is no function', async () => {
    const engine = createIdempotency({ store: memoryStore(), heartbeat: false });
    await expect(
      engine.begin({ key: 'k-1', scope: 'caller', operation: 'POST /charges', alternateFingerprints: ['x'] as never }),
    ).rejects.toThrow(new TypeError('begin needs alternateFingerprints as a function returning fingerprints, or none'));
  });
});

describe('fingerprint.previous is checked at construction', () => {
  const made = (previous: unknown) => () =>
    createHttpIdempotency({ store: memoryStore(), fingerprint: { exclude: ['/sentAt'], previous } as never });

  it('refuses a previous that is no array of settings objects', () => {
    for (const bad of [{}, 'exclude', [null], ['x'], [[]], [1]]) {
      expect(made(bad), JSON.stringify(bad)).toThrow(TypeError);
    }
    expect(made({})).toThrow(
      new TypeError(
        'fingerprint.previous must be an array of earlier fingerprint settings, each { exclude?, headers? }',
      ),
    );
    expect(made([{}, null])).toThrow(new TypeError('fingerprint.previous[1] must be { exclude?, headers? }'));
  });

  it('refuses an unknown option in a previous setting, nested previous included', () => {
    expect(made([{ exlude: ['/sentAt'] }])).toThrow(
      new TypeError('fingerprint.previous[0]: unknown option "exlude" (did you mean "exclude"?)'),
    );
    expect(made([{ previous: [] }])).toThrow(/fingerprint\.previous\[0\]: unknown option "previous"/);
  });

  it("checks a previous setting's exclude and headers as the current ones, naming the entry", () => {
    expect(made([{}, { exclude: ['sentAt'] }])).toThrow(/^fingerprint\.previous\[1\]\.exclude holds "sentAt"/);
    expect(made([{ headers: ['authorization'] }])).toThrow(
      new TypeError(
        'fingerprint.previous[0].headers must not include authorization: it changes from one attempt to the next, so every retry would be refused 422',
      ),
    );
    expect(made([{ headers: ['api version'] }])).toThrow(/^fingerprint\.previous\[0\]\.headers holds "api version"/);
    expect(made([{ headers: 'api-version' }])).toThrow(
      new TypeError('fingerprint.previous[0].headers must be an array of header names'),
    );
  });

  it('takes an empty list, undefined, and settings whose options are undefined', () => {
    for (const good of [
      [],
      undefined,
      [{}],
      [{ exclude: undefined, headers: undefined }],
      [{ headers: ['x-tenant'] }],
    ]) {
      expect(made(good), JSON.stringify(good)).not.toThrow();
    }
  });

  it('needs the request headers when a previous setting names any, though the current one does not', async () => {
    const { server } = deploy();
    await firstRun(server({ headers: ['api-version'] }));
    const updated = server({ previous: [{ headers: ['api-version'] }] });
    await expect(updated.begin(charge({ headers: undefined }))).rejects.toThrow(
      new TypeError('fingerprint.previous names headers, but the adapter passed no request headers to begin()'),
    );
  });
});
