import { describe, expect, it } from 'vitest';
import { hasQueryToken } from '../src/index.js';

// The one reading of "this request carries a query token" (RFC 6750 §2.3): the guard's own test of a
// credential, and what a gateway checks so as never to forward a token in a URL.
describe('hasQueryToken', () => {
  it('finds access_token in the query, with or without a value, under any percent-encoding of its name', () => {
    for (const url of [
      '/p?access_token=eyJ',
      '/p?a=1&access_token=',
      '/p?access_token',
      '/p?access%5Ftoken=x',
      '/p?%61ccess_token=x',
    ]) {
      expect(hasQueryToken(url), url).toBe(true);
    }
  });

  it('finds nothing in other names, in the path, or without a URL', () => {
    for (const url of ['/p', '/p?token=x', '/p?my_access_token=x', '/p?x=access_token', '/access_token=x', '']) {
      expect(hasQueryToken(url), url).toBe(false);
    }
    expect(hasQueryToken(undefined)).toBe(false);
  });
});
