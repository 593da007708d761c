import { describe, expect, it } from 'vitest';
import { safeReturnTo } from '../src/app/server.js';
import { assertRedirectUris } from '../src/idp/clients.js';

describe('safeReturnTo (row 37)', () => {
  it.each([
    ['/', '/'],
    ['/photos?x=1', '/photos?x=1'],
    ['//evil.example', '/'],
    ['/\\evil.example', '/'],
    ['https://evil.example', '/'],
    ['javascript:alert(1)', '/'],
    ['/ok\r\nSet-Cookie: x=1', '/'],
    [undefined, '/'],
    [['/a', '/b'], '/'],
  ])('%j becomes %j', (input, expected) => {
    expect(safeReturnTo(input)).toBe(expected);
  });
});

describe('assertRedirectUris (row 31)', () => {
  it('refuses a client without redirect URIs', () => {
    expect(() => assertRedirectUris({ client_id: 'x' })).toThrow(TypeError);
  });
});
