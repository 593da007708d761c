import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpRequestInfo } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';

// Cases the first tests of fingerprint.headers and fingerprint.exclude left open.

const base = { method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json' };

// A keyed POST /charges of one caller with a JSON body, and the request headers given.
const charge = (key: string, headers: HttpRequestInfo['headers']): HttpRequestInfo => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: 'application/json',
  keyHeader: key,
  body: Buffer.from('{"amount":1}'),
  scope: 'caller',
  headers,
});

const made = (fingerprint: unknown) => () =>
  createHttpIdempotency({ store: memoryStore(), fingerprint: fingerprint as never });

describe('fingerprint.headers: the values of the named headers are part of the request', () => {
  // Runs `first` under `key` to its stored outcome, then answers what `second` gets with that key.
  async function retried(names: string[], key: string, first: HttpRequestInfo['headers'], second: typeof first) {
    const http = createHttpIdempotency({ store: memoryStore(), fingerprint: { headers: names } });
    const started = await http.begin(charge(key, first));
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    const response = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('ch_1') };
    await http.settle(started.lease, { kind: 'complete', response }, false);
    const again = await http.begin(charge(key, second));
    return again.kind === 'respond' ? again.response.status : again.kind;
  }

  it('a header named in any case is read, and another value of it is another request (422)', async () => {
    expect(await retried(['API-Version'], 'k-1', { 'api-version': '2024-01' }, { 'api-version': '2024-01' })).toBe(201);
    expect(await retried(['API-Version'], 'k-2', { 'api-version': '2024-01' }, { 'api-version': '2025-06' })).toBe(422);
  });

  it('an absent header and an empty one are alike, and a repeated field is its values joined as Node joins them', async () => {
    expect(await retried(['x-tenant'], 'k-3', {}, { 'x-tenant': '' })).toBe(201);
    expect(await retried(['x-tenant'], 'k-4', { 'x-tenant': '' }, {})).toBe(201);
    expect(await retried(['x-tenant'], 'k-5', { 'x-tenant': ['a', 'b'] }, { 'x-tenant': 'a, b' })).toBe(201);
  });

  it('an empty list takes nothing in, so an adapter passing no headers is fine', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), fingerprint: { headers: [] } });
    expect((await http.begin(charge('k-6', undefined))).kind).toBe('execute');
  });

  it('does not depend on the order the headers are named in, or given in', () => {
    const one = fingerprintRequest({ ...base, body: '{}', headers: { 'api-version': '1', 'x-tenant': 't' } });
    const two = fingerprintRequest({ ...base, body: '{}', headers: { 'x-tenant': 't', 'api-version': '1' } });
    expect(one).toBe(two);
  });

  it('an absent header fingerprints as an empty one, in fingerprintRequest too', () => {
    expect(fingerprintRequest({ ...base, body: '{}', headers: { 'x-tenant': undefined } })).toBe(
      fingerprintRequest({ ...base, body: '{}', headers: { 'x-tenant': '' } }),
    );
  });

  it('refuses every per-attempt header it lists, whatever the case', () => {
    const perAttempt = [
      'authorization',
      'proxy-authorization',
      'cookie',
      'dpop',
      'idempotency-key',
      'date',
      'content-length',
      'transfer-encoding',
      'connection',
      'keep-alive',
      'te',
      'expect',
      'upgrade',
      'x-request-id',
      'request-id',
      'x-correlation-id',
      'traceparent',
      'tracestate',
      'baggage',
      'x-amzn-trace-id',
      'x-b3-traceid',
      'x-b3-spanid',
      'b3',
      'x-cloud-trace-context',
      'x-forwarded-for',
      'x-forwarded-proto',
      'forwarded',
      'x-real-ip',
    ];
    for (const name of perAttempt) {
      expect(made({ headers: [name] }), name).toThrow(/changes from one attempt to the next/);
      expect(made({ headers: ['api-version', name.toUpperCase()] }), name).toThrow(/changes from one attempt/);
    }
  });

  it('takes a header whose name only begins or ends like a per-attempt one', () => {
    // `te` and `date` are whole names: a tenant header or a site header is an honest identity.
    for (const name of ['tenant-id', 'x-site', 'x-date-format', 'upgrade-plan', 'x-cookie-consent'])
      expect(made({ headers: [name] }), name).not.toThrow();
  });

  // Headers that change on every attempt: taken in, every honest retry carrying them is refused 422.
  // @idem/webhooks' own sender signs a fresh `webhook-timestamp` (and so a new `webhook-signature`)
  // on every attempt (sender.ts, "fresh on every attempt"), as Svix and Stripe sign theirs and
  // RFC 9421 and SigV4 date theirs; Envoy, one of the anchors, sets `x-envoy-attempt-count` on each
  // retry; tracers and CDNs stamp their own ids.
  it('refuses the per-attempt headers of webhook senders, message signatures, proxies and tracers', () => {
    const names = [
      'webhook-timestamp',
      'webhook-signature',
      'svix-timestamp',
      'svix-signature',
      'stripe-signature',
      'signature',
      'signature-input',
      'x-amz-date',
      'x-envoy-attempt-count',
      'sentry-trace',
      'x-datadog-trace-id',
      'cf-ray',
    ];
    for (const name of names) expect(made({ headers: [name] }), name).toThrow(/changes from one attempt to the next/);
  });
});

describe('fingerprint.exclude: checked at construction, and what a pointer leaves out', () => {
  it('checks every pointer, not only the first, and wants an array', () => {
    expect(made({ exclude: ['/sentAt', 'nonce'] })).toThrow(/no JSON Pointer/);
    expect(made({ exclude: ['/sentAt', '/meta/nonce', '/x~2'] })).toThrow(/no JSON Pointer/);
    // An iterable that is no array: its `length` is undefined, so it would exclude nothing.
    expect(made({ exclude: new Set(['/sentAt']) })).toThrow(/must be an array of JSON Pointers/);
  });

  it('`-` names no array item (RFC 6901: the one after the last), so it leaves nothing out', () => {
    const fp = (body: unknown) => fingerprintRequest({ ...base, json: body }, { exclude: ['/t/-'] });
    expect(fp({ t: ['a', 'b'] })).not.toBe(fp({ t: ['a', 'c'] }));
    expect(fp({ t: ['a', 'b'] })).not.toBe(fp({ t: ['c', 'b'] }));
  });

  it('an item left out is removed, not blanked: the items after it move up', () => {
    const fp = (body: unknown) => fingerprintRequest({ ...base, json: body }, { exclude: ['/t/0'] });
    // As JSON Patch's remove (RFC 6902 4.2): without its first item, ['volatile'] is [], as [] is.
    expect(fp({ t: ['volatile'] })).toBe(fp({ t: [] }));
    expect(fp({ t: ['x', 'b'] })).toBe(fp({ t: ['y', 'b'] }));
  });

  it("never reaches past the body into the objects' prototypes", () => {
    const before = Object.getOwnPropertyDescriptor(Object.prototype, 'toLocaleString');
    try {
      fingerprintRequest({ ...base, body: '{"a":1}' }, { exclude: ['/__proto__/toLocaleString'] });
      expect(Object.hasOwn(Object.prototype, 'toLocaleString')).toBe(true);
    } finally {
      if (before && !Object.hasOwn(Object.prototype, 'toLocaleString'))
        Object.defineProperty(Object.prototype, 'toLocaleString', before);
    }
  });
});
