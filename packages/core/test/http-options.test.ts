import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';

// A keyed POST /charges of one caller, with no body.
const charge = (keyHeader: string) => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: undefined,
  keyHeader,
  body: undefined,
  scope: 'caller',
});

describe('createHttpIdempotency options', () => {
  it('refuses a conflictRetryAfter or unavailableRetryAfter that is no delay-seconds, naming the option', () => {
    for (const name of ['conflictRetryAfter', 'unavailableRetryAfter'] as const) {
      for (const bad of ['1s', '1', 1.5, -1, Number.NaN, Number.POSITIVE_INFINITY, 1e21, null]) {
        expect(() => createHttpIdempotency({ store: memoryStore(), [name]: bad as never }), `${name}: ${bad}`).toThrow(
          new TypeError(`${name} must be a whole number of seconds, at least 0 (it is sent as Retry-After)`),
        );
      }
    }
  });

  it('puts a good one on the wire as it is: 0 is a valid delay', async () => {
    for (const seconds of [0, 5]) {
      const http = createHttpIdempotency({ store: memoryStore(), conflictRetryAfter: seconds });
      const request = charge('k-1');
      expect((await http.begin(request)).kind).toBe('execute');
      const second = await http.begin(request);
      expect(second.kind === 'respond' && second.response.headers['retry-after']).toBe(String(seconds));
    }
  });

  it('refuses an advertiseExpiry that is not a boolean', () => {
    for (const bad of ['yes', 1, {}]) {
      expect(() => createHttpIdempotency({ store: memoryStore(), advertiseExpiry: bad as never }), String(bad)).toThrow(
        new TypeError('advertiseExpiry must be a boolean'),
      );
    }
  });

  it('refuses fingerprint.exclude entries that are no JSON Pointer, at construction', () => {
    const made = (exclude: unknown) => () =>
      createHttpIdempotency({ store: memoryStore(), fingerprint: { exclude } as never });
    for (const bad of [['sentAt'], ['/a~2b'], ['/a~'], [1], '/sentAt', [null]]) {
      expect(made(bad), JSON.stringify(bad)).toThrow(TypeError);
    }
    expect(made(['sentAt'])).toThrow(/no JSON Pointer/);
    for (const good of [[], [''], ['/'], ['/sentAt', '/items/*/nonce', '/a~0b~1c', '/0']]) {
      expect(made(good), JSON.stringify(good)).not.toThrow();
    }
  });

  it('refuses fingerprint.headers that are no header names, or change from one attempt to the next', () => {
    const made = (headers: unknown) => () =>
      createHttpIdempotency({ store: memoryStore(), fingerprint: { headers } as never });
    for (const bad of [
      ['Authorization'],
      ['cookie'],
      ['Idempotency-Key'],
      ['traceparent'],
      ['x-forwarded-for'],
      ['DPoP'],
    ]) {
      expect(made(bad), String(bad)).toThrow(/changes from one attempt to the next/);
    }
    for (const bad of [['api version'], [''], [42], 'api-version', ['x:y']]) {
      expect(made(bad), JSON.stringify(bad)).toThrow(TypeError);
    }
    for (const good of [[], ['API-Version'], ['stripe-version', 'x-tenant', 'Stripe-Version']]) {
      expect(made(good), JSON.stringify(good)).not.toThrow();
    }
  });

  // Decided: HTTP gives an empty field value no meaning of its own, and proxies and clients drop or
  // add empty headers freely, so a named header sent empty is the same request as one not sent; its
  // value is compared as sent otherwise (Node trims the edges, repeats joined with ", ").
  it('fingerprint.headers: a header sent empty fingerprints as one not sent; any value differs from both', () => {
    const parts = { method: 'POST', route: '/charges', path: '/charges' };
    const withHeader = (value: string | undefined) =>
      fingerprintRequest({ ...parts, headers: { 'api-version': value } });
    expect(withHeader('')).toBe(withHeader(undefined));
    expect(withHeader('1')).not.toBe(withHeader(undefined));
    expect(withHeader('1')).not.toBe(withHeader('1, 2'));
    expect(withHeader('v1')).not.toBe(withHeader('V1'));
  });

  it('fingerprint.headers needs the request headers from the adapter, and reads them in any case', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), fingerprint: { headers: ['API-Version'] } });
    const request = charge('k-h');
    await expect(http.begin(request)).rejects.toThrow(/passed no request headers/);
    expect((await http.begin({ ...request, headers: { 'api-version': ['1', '2'] } })).kind).toBe('execute');
  });
});
