import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';
import { assertKnownOptions } from '../src/option-names.js';

// A misspelt option used to be ignored: its default ran instead, without a word.
describe('unknown option names are refused at construction', () => {
  it('the engine names the misspelt option and the one meant', () => {
    expect(() => createIdempotency({ store: memoryStore(), retension: '7d' } as never)).toThrow(
      new TypeError('createIdempotency: unknown option "retension" (did you mean "retention"?)'),
    );
    expect(() => createIdempotency({ store: memoryStore(), StoreOutcome: 'success' } as never)).toThrow(
      /unknown option "StoreOutcome" \(did you mean "storeOutcome"\?\)/,
    );
  });

  it('a name near none lists what the receiver takes', () => {
    expect(() => createIdempotency({ store: memoryStore(), ttlSeconds: 60 } as never)).toThrow(
      /^createIdempotency: unknown option "ttlSeconds"; it takes store, retention, .*replayCache$/,
    );
  });

  it('the engine refuses the names of the HTTP layer: they mean nothing to it', () => {
    expect(() => createIdempotency({ store: memoryStore(), mintKeys: true } as never)).toThrow(
      /createIdempotency: unknown option "mintKeys"/,
    );
  });

  it('the HTTP layer takes its own names and those of the engine, and refuses others', () => {
    expect(() =>
      createHttpIdempotency({
        store: memoryStore(),
        retention: '2d',
        mintKeys: true,
        methods: ['POST'],
        fingerprint: { exclude: ['/sentAt'], headers: ['api-version'] },
      }),
    ).not.toThrow();
    expect(() => createHttpIdempotency({ store: memoryStore(), mintKey: true } as never)).toThrow(
      new TypeError('idempotency: unknown option "mintKey" (did you mean "mintKeys"?)'),
    );
    expect(() => createHttpIdempotency({ store: memoryStore(), maxBodyByte: 10 } as never)).toThrow(
      /idempotency: unknown option "maxBodyByte" \(did you mean "maxBodyBytes"\?\)/,
    );
  });

  it('nested option objects are checked too: fingerprint, replayCache, the memory store', () => {
    expect(() => createHttpIdempotency({ store: memoryStore(), fingerprint: { excludes: ['/a'] } } as never)).toThrow(
      /fingerprint: unknown option "excludes" \(did you mean "exclude"\?\)/,
    );
    expect(() => createHttpIdempotency({ store: memoryStore(), fingerprint: 'none' } as never)).toThrow(
      new TypeError('fingerprint must be { exclude?, headers?, previous? }'),
    );
    expect(() => createIdempotency({ store: memoryStore(), replayCache: { ttl: '1s', size: 10 } } as never)).toThrow(
      /replayCache: unknown option "size"/,
    );
    expect(() => memoryStore({ maxEntry: 10 } as never)).toThrow(
      /memoryStore: unknown option "maxEntry" \(did you mean "maxEntries"\?\)/,
    );
  });

  it('an option set to undefined is still an option that must exist', () => {
    expect(() => createIdempotency({ store: memoryStore(), retention: undefined })).not.toThrow();
    expect(() => createIdempotency({ store: memoryStore(), leaseMs: undefined } as never)).toThrow(
      /unknown option "leaseMs"/,
    );
  });

  it('assertKnownOptions is what the stores use: the nearest name within two edits (or a third of a long one), any case', () => {
    const known = new Set(['client', 'prefix']);
    expect(() => assertKnownOptions({ client: 1, prefix: 'x' }, known, 'store')).not.toThrow();
    expect(() => assertKnownOptions({ PREFIX: 'x' }, known, 'store')).toThrow('did you mean "prefix"?');
    expect(() => assertKnownOptions({ clnt: 1 }, known, 'store')).toThrow('did you mean "client"?');
    expect(() => assertKnownOptions({ prefixes: 1 }, known, 'store')).toThrow('did you mean "prefix"?');
    expect(() => assertKnownOptions({ clientele: 1 }, known, 'store')).toThrow('did you mean "client"?');
    expect(() => assertKnownOptions({ pfx: 1 }, known, 'store')).toThrow('; it takes client, prefix');
    expect(() => assertKnownOptions({ url: 1 }, known, 'store')).toThrow(
      new TypeError('store: unknown option "url"; it takes client, prefix'),
    );
  });
});

describe('options only a request would have found wrong', () => {
  it('now must be a function (it used to fail at the first request, as a 500)', () => {
    expect(() => createIdempotency({ store: memoryStore(), now: 5 as never })).toThrow(
      new TypeError('now must be a function returning epoch milliseconds'),
    );
    expect(() => memoryStore({ now: 'Date.now' as never })).toThrow(/now must be a function/);
  });

  it('methods must be a non-empty list of method names (an empty one covered nothing, silently)', () => {
    for (const bad of [[], 'POST', [''], ['PO ST'], [1]]) {
      expect(() => createHttpIdempotency({ store: memoryStore(), methods: bad as never }), String(bad)).toThrow(
        TypeError,
      );
    }
    expect(() => createHttpIdempotency({ store: memoryStore(), methods: [] })).toThrow(
      new TypeError('methods must be a non-empty array of method names, such as ["POST", "PATCH"]'),
    );
    expect(() => createHttpIdempotency({ store: memoryStore(), methods: ['post', 'DELETE'] })).not.toThrow();
  });
});
