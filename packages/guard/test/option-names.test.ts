import { describe, expect, it } from 'vitest';
import { createGuard, createInternalTokenIssuer, createInternalVerifier } from '../src/index.js';
import { AUDIENCE, ISSUER, SECRET } from './support/tokens.js';

// A misspelt rule used to be ignored, and the check it meant to set was left at its default.
describe('unknown option names are refused at construction', () => {
  const issuer = { issuer: ISSUER, secret: SECRET };
  const build =
    (options: Record<string, unknown>, issuerOptions: Record<string, unknown> = {}) =>
    () =>
      createGuard({ audience: AUDIENCE, issuers: [{ ...issuer, ...issuerOptions }], ...options } as never);

  it('top-level guard options', () => {
    expect(build({})).not.toThrow();
    expect(build({ requiredClaim: ['tenant'] })).toThrow(
      /^createGuard: unknown option "requiredClaim"; it takes audience, audienceClaim, clockTolerance, .*internalTokens$/,
    );
    expect(build({ audiance: 'x', realms: 'x' })).toThrow(
      /^createGuard: unknown options "audiance", "realms"; it takes /,
    );
  });

  it('per-issuer options, their jwksOptions, and the nested limits, cache and dpop objects', () => {
    expect(build({}, { maxTokenAges: 60 })).toThrow(`issuer ${ISSUER}: unknown option "maxTokenAges"`);
    expect(() =>
      createGuard({
        audience: AUDIENCE,
        issuers: [
          { issuer: 'https://id.example', jwksUri: 'https://id.example/jwks', jwksOptions: { ttl: 60 } as never },
        ],
      }),
    ).toThrow('issuer https://id.example: jwksOptions: unknown option "ttl"');
    expect(() =>
      createGuard({
        audience: AUDIENCE,
        issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks', jwksOptions: 'fast' as never }],
      }),
    ).toThrow('issuer https://id.example: jwksOptions must be an object');
    expect(build({ limits: { maxLength: 10 } })).toThrow('limits: unknown option "maxLength"');
    expect(build({ cache: { size: 10 } })).toThrow('cache: unknown option "size"');
    expect(build({ cache: 'lru' })).toThrow('cache must be false or an object');
    expect(build({ dpop: { require: true } })).toThrow('dpop: unknown option "require"');
    expect(build({ dpop: { nonce: { secret: 'x'.repeat(32), ttl: 60 } } })).toThrow('dpop.nonce: unknown option "ttl"');
    expect(build({ dpop: { required: true, nonce: { secret: 'x'.repeat(32), lifetime: 60 } } })).not.toThrow();
  });

  it('the internal token issuer and verifier', () => {
    expect(() => createInternalTokenIssuer({ issuer: 'gw', lifetime: 60 } as never)).toThrow(
      'createInternalTokenIssuer: unknown option "lifetime"',
    );
    expect(() =>
      createInternalVerifier({ issuer: 'gw', audience: 'svc', jwks: { keys: [] }, headerName: 'x-t' } as never),
    ).toThrow('createInternalVerifier: unknown option "headerName"');
  });
});

describe('options only a request would have found wrong', () => {
  const build =
    (options: Record<string, unknown>, issuerOptions: Record<string, unknown> = {}) =>
    () =>
      createGuard({
        audience: AUDIENCE,
        issuers: [{ issuer: ISSUER, secret: SECRET, ...issuerOptions }],
        ...options,
      } as never);

  it('now and fetch must be functions', () => {
    expect(build({ now: 0 })).toThrow(new TypeError('now must be a function returning epoch milliseconds'));
    expect(build({ fetch: 'fetch' })).toThrow(new TypeError('fetch must be a function'));
  });

  it('rolesClaim must be a claim name (a number read no roles from any token)', () => {
    for (const bad of [1, '']) {
      expect(build({}, { rolesClaim: bad }), String(bad)).toThrow(`issuer ${ISSUER}: rolesClaim must be a claim name`);
    }
    expect(build({ rolesClaim: 'groups' })).not.toThrow();
  });

  it('rolesClaim may be a path of 1 to 8 member names, nothing else', () => {
    for (const bad of [[], [''], ['a', 1], Array(9).fill('a'), { 0: 'a' }]) {
      expect(build({}, { rolesClaim: bad }), JSON.stringify(bad)).toThrow(
        `issuer ${ISSUER}: rolesClaim must be a claim name, or an array of 1 to 8 member names`,
      );
    }
    expect(build({ rolesClaim: ['realm_access', 'roles'] })).not.toThrow();
  });

  it('maxLifetime and maxTokenAge of 0 are refused: they refused every token', () => {
    expect(build({ maxLifetime: 0 })).toThrow('maxLifetime must be a number of seconds, at least 1');
    expect(build({}, { maxTokenAge: 0 })).toThrow('maxTokenAge must be a number of seconds, at least 1');
    expect(build({ maxLifetime: 1, maxTokenAge: 3600 })).not.toThrow();
  });
});
