// A `scope` function that answers with an empty string has found no caller, just as one that
// answers `undefined`. Tenant lookups are often written so that a missing claim falls back to ''
// (`String(claims.tenant ?? '')`, `req.auth?.claims.org ?? ''`), and then every request without
// the claim would share one namespace: exactly the cross-tenant leak `scope_missing` exists to stop.
import { describe, expect, it } from 'vitest';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpRequestInfo } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';

const charge = (scope: string | undefined): HttpRequestInfo => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: 'application/json',
  keyHeader: 'k-1',
  body: Buffer.from('{"amount":1}'),
  scope,
});

describe('begin: an empty scope is no caller', () => {
  // Was wrong: '' was taken as a caller, so two callers whose tenant claim was missing shared one
  // record: the second got the first one's stored response, replayed.
  it('answers an empty scope with 500 scope_missing, as undefined, and claims nothing', async () => {
    const store = memoryStore();
    const http = createHttpIdempotency({ store });
    for (const scope of ['', undefined]) {
      const started = await http.begin(charge(scope));
      expect(started.kind).toBe('respond');
      if (started.kind !== 'respond') continue;
      expect(started.response.status).toBe(500);
      expect(JSON.parse(Buffer.from(started.response.body ?? []).toString())).toMatchObject({
        code: 'scope_missing',
      });
    }
    // Nothing was claimed: a caller with a scope runs the key fresh.
    expect(await http.begin(charge('tenant-1'))).toMatchObject({ kind: 'execute' });
  });
});

describe('begin: a scope that is no string', () => {
  // Was wrong: a scope function that returned a number (a numeric tenant id) or an object threw a
  // TypeError out of the middleware, which the framework answered with its own 500 page (Express's
  // HTML with the stack trace outside production) instead of a problem body with a code.
  it('answers 500 scope_missing naming what the scope option returned, and claims nothing', async () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    for (const [scope, named] of [
      [42, 'a number'],
      [{ tenant: 'a' }, 'an object'],
      [null, 'null'],
    ] as const) {
      const started = await http.begin({ ...charge('x'), scope: scope as unknown as string });
      expect(started.kind).toBe('respond');
      if (started.kind !== 'respond') continue;
      expect(started.response.status).toBe(500);
      const problem = JSON.parse(Buffer.from(started.response.body ?? []).toString());
      expect(problem).toMatchObject({ code: 'scope_missing' });
      expect(problem.detail).toContain(named);
    }
  });
});
