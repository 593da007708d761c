// The consent page's list: every scope asked for, in words and by name, those allowed before marked
// so, per resource; never "asks to:" over nothing.
import { expect, it } from 'vitest';
import { consentPage } from '../src/idp/pages.js';
import { consentItems } from './flow.js';

const base = { uid: 'u', csrf: 'x', clientName: 'Photo <app>', userName: 'Alice' };

it('marks a scope allowed before at its own resource only, and escapes what it shows', () => {
  const page = consentPage({
    ...base,
    scopes: ['openid', 'email'],
    scopesAllowedBefore: ['openid'],
    resources: [
      { resource: 'https://a.example', scopes: ['photos:read'], allowedBefore: ['photos:read'] },
      { resource: 'https://b.example/?x=<y>', scopes: ['photos:read', '<odd>'] },
    ],
  });
  expect(consentItems(page)).toEqual([
    { scope: 'openid', allowedBefore: true },
    { scope: 'email', allowedBefore: false },
    { scope: 'photos:read', allowedBefore: true },
    { scope: 'photos:read', allowedBefore: false },
    { scope: '&lt;odd&gt;', allowedBefore: false },
  ]);
  expect(page).toContain('<strong>Photo &lt;app&gt;</strong> asks to:');
  expect(page).toContain('<h2>At https://b.example/?x=&lt;y&gt;</h2>');
});

it('marks a scope refused before as not given, at its own resource only, never as allowed before', () => {
  const page = consentPage({
    ...base,
    scopes: ['openid', 'email'],
    scopesAllowedBefore: ['openid'],
    scopesRefusedBefore: ['email'],
    resources: [
      { resource: 'https://a.example', scopes: ['photos:read'], refusedBefore: ['photos:read'] },
      { resource: 'https://b.example', scopes: ['photos:read'] },
    ],
  });
  expect(consentItems(page)).toEqual([
    { scope: 'openid', allowedBefore: true },
    { scope: 'email', allowedBefore: false },
    { scope: 'photos:read', allowedBefore: false },
    { scope: 'photos:read', allowedBefore: false },
  ]);
  expect(page).toContain('See your email address <code>email</code> (refused before, not given)</li>');
  expect(page).toContain(
    '<h2>At https://a.example</h2>\n<ul><li>See your photos <code>photos:read</code> (refused before, not given)</li></ul>',
  );
  expect(page).toContain('<h2>At https://b.example</h2>\n<ul><li>See your photos <code>photos:read</code></li></ul>');
});

// Was wrong: a consent that asked for no scope the provider knows said "asks to:" over nothing.
it('says in words that nothing is asked for, rather than "asks to:" over an empty list', () => {
  const page = consentPage({ ...base, scopes: [], resources: [{ resource: 'https://a.example', scopes: [] }] });
  expect(page).not.toContain('asks to:');
  expect(page).not.toContain('<ul>');
  expect(page).not.toContain('<h2>');
  expect(page).toContain('asks for no access beyond this sign-in.');
});
