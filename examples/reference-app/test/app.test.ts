import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { safeReturnTo } from '../src/app/server.js';
import { assertRedirectUris } from '../src/idp/clients.js';
import { oidcScopes } from '../src/idp/provider.js';
import { apiScopes } from '../src/scopes.js';

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

describe('README', () => {
  it('lists every scope the provider issues, and no other', () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    // The bullet may wrap: it runs until the next bullet or blank line.
    const bullet = /^- Scopes:([\s\S]*?)(?=\n- |\n\n)/m.exec(readme)?.[1] ?? '';
    const listed = [...bullet.matchAll(/`([^`]+)`/g)].flatMap((match) => (match[1] ?? '').split(/\s+/));
    const issued = [...oidcScopes, ...apiScopes];
    const scopes = new Set(listed.filter((name) => /^[a-z_]+(:[a-z]+)?$/.test(name)));
    expect([...scopes].sort()).toEqual([...issued].sort());
  });
});
