import { createGuard } from '@idem/guard';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, SECRET } from '../../guard/test/support/tokens.js';
import { guard } from '../src/auth.js';

// What optional guards answer is the shared table's (describeAuthGlue, with a guard of its own realm
// so that a default challenge shows); here, the glue options, checked when the middleware is made.
describe('Express guard() glue options', () => {
  const edge = createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });

  it('bad glue options are a TypeError when the middleware is made, not a guard that is silently required', () => {
    expect(() => guard(edge, { optional: 'yes' as never })).toThrow(/optional must be a boolean/);
    expect(() => guard(edge, true as never)).toThrow(TypeError);
    expect(() => guard(edge, null as never)).toThrow(TypeError);
  });
});
