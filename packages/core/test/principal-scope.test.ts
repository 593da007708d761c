import { describe, expect, it } from 'vitest';
import { principalScope } from '../src/principal-scope.js';

describe('principalScope', () => {
  const alice = { iss: 'https://id.example', sub: 'alice', clientId: 'photo-app' };

  it('is the issuer and user by default, so every client of one user shares the keys', () => {
    expect(principalScope(alice)).toBe('["https://id.example","alice"]');
    expect(principalScope({ ...alice, clientId: 'other-app' })).toBe(principalScope(alice));
    expect(principalScope({ sub: 'alice' })).toBe('["","alice"]');
  });

  it('with perClient, two clients of one user never share a key, and no client id means no scope', () => {
    expect(principalScope(alice, { perClient: true })).toBe('["https://id.example","alice","photo-app"]');
    expect(principalScope({ ...alice, clientId: 'other-app' }, { perClient: true })).not.toBe(
      principalScope(alice, { perClient: true }),
    );
    expect(principalScope({ iss: alice.iss, sub: 'alice' }, { perClient: true })).toBeUndefined();
    expect(principalScope({ ...alice, clientId: '' }, { perClient: true })).toBeUndefined();
  });

  it('has no scope without a user, whatever else the value holds', () => {
    for (const auth of [undefined, null, 'alice', {}, { sub: '' }, { sub: 7, iss: alice.iss }]) {
      expect(principalScope(auth)).toBeUndefined();
      expect(principalScope(auth, { perClient: true })).toBeUndefined();
    }
  });

  it('keeps parts apart whatever characters they hold', () => {
    expect(principalScope({ iss: 'a","b', sub: 'c' }, {})).not.toBe(principalScope({ iss: 'a', sub: 'b","c' }));
    expect(principalScope({ iss: 'i', sub: 's", "c', clientId: 'd' }, { perClient: true })).not.toBe(
      principalScope({ iss: 'i', sub: 's', clientId: 'c", "d' }, { perClient: true }),
    );
  });
});
