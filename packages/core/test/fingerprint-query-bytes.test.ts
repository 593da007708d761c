import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';

const base = { method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json', body: '{}' };
const withQuery = (query: string) => fingerprintRequest({ ...base, query });

// The adapters pass the raw query string. Decoded as WHATWG URLSearchParams decodes it, every escape
// that is not UTF-8 became U+FFFD, so `?id=%FF` and `?id=%FE` framed alike. Express (qs) and Fastify
// (fast-querystring) hand the handler `'%FF'` and `'%FE'`: two requests, and the second one, under
// the first one's key, was replayed the first one's response instead of being refused 422.
describe('fingerprintRequest: a query escape that is not UTF-8', () => {
  it('keeps two different bytes apart', () => {
    expect(withQuery('id=%FF')).not.toBe(withQuery('id=%FE'));
    expect(withQuery('%FF=1')).not.toBe(withQuery('%FE=1'));
    expect(withQuery('id=a%C3')).not.toBe(withQuery('id=a%C4'));
  });

  it('is not the replacement character that stands for it', () => {
    expect(withQuery('id=%FF')).not.toBe(withQuery('id=%EF%BF%BD'));
    expect(withQuery('id=%FF')).not.toBe(withQuery('id=\uFFFD'));
  });

  it('is still one request however it is spelled', () => {
    expect(withQuery('id=%ff&b=1')).toBe(withQuery('b=1&id=%FF'));
    expect(withQuery('id=a+%FF')).toBe(withQuery('id=a%20%ff'));
  });

  it('leaves the fingerprint of a query that is UTF-8 as it was', () => {
    // Records stored before keep matching: the same as the parsed pairs give.
    expect(withQuery('n=%C3%A9&m=%41+b')).toBe(fingerprintRequest({ ...base, query: { n: 'é', m: 'A b' } }));
    expect(withQuery('a=%zz')).toBe(fingerprintRequest({ ...base, query: { a: '%zz' } }));
  });
});
