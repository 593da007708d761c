import { describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import { seconds } from '../src/seconds.js';
import { AUDIENCE, ISSUER, SECRET } from './support/tokens.js';

describe('duration options in seconds', () => {
  it('accepts a finite number in range and names the option and range otherwise', () => {
    expect(seconds(0, 'x')).toBe(0);
    expect(seconds(0.5, 'x', { min: 0.01, max: 60 })).toBe(0.5);
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, '5', undefined]) {
      expect(() => seconds(bad, 'jwks cooldown')).toThrow(/jwks cooldown must be a number of seconds, at least 0/);
    }
    expect(() => seconds(61, 'clockTolerance', { max: 60 })).toThrow(/clockTolerance .* 0 to 60/);
    expect(() => seconds(0, 'dpop.maxAge', { min: 1, max: 3600 })).toThrow(TypeError);
    // Both bounds are inclusive.
    expect(seconds(60, 'clockTolerance', { max: 60 })).toBe(60);
    expect(seconds(1, 'dpop.maxAge', { min: 1, max: 3600 })).toBe(1);
  });

  it('holds every duration option of the guard, remote JWKS ones included, at construction', () => {
    const make =
      (extra: object, jwksOptions: object = {}) =>
      () =>
        createGuard({
          audience: AUDIENCE,
          ...extra,
          issuers: [{ issuer: ISSUER, jwksUri: 'https://id.example/jwks', algorithms: ['ES256'], jwksOptions }],
        });
    expect(make({})).not.toThrow();
    expect(make({ maxTokenAge: -1 })).toThrow(/maxTokenAge/);
    expect(make({ maxLifetime: Number.NaN })).toThrow(/maxLifetime/);
    for (const name of ['timeout', 'cooldown', 'defaultTtl', 'minTtl', 'maxTtl', 'staleIfError', 'negativeTtl']) {
      expect(make({}, { [name]: -1 })).toThrow(new RegExp(`jwks ${name}`));
    }
    expect(() => createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] })).not.toThrow();
  });
});
