// saysTokenInvalid is exported for callers that make their own requests (the reference app's page
// reads) and must tell a refused token from any other 401 exactly as the client does.
import { describe, expect, it } from 'vitest';
import { saysTokenInvalid } from '../src/index.js';

describe('saysTokenInvalid', () => {
  it.each([
    ['Bearer realm="api", error="invalid_token"', true],
    ['Bearer error=invalid_token', true],
    ['DPoP algs="ES256", Bearer realm="api", error="invalid_token"', true],
    ['Bearer realm="api"', false],
    ['Bearer realm="api", error="insufficient_scope"', false],
    ['Bearer error="invalid_request", error_description="not error=invalid_token"', false],
    ['Basic realm="error=invalid_token"', false],
  ])('%s: %s', (challenge, invalid) => {
    expect(saysTokenInvalid(challenge)).toBe(invalid);
  });

  it('is false without a WWW-Authenticate field', () => {
    expect(saysTokenInvalid(null)).toBe(false);
  });
});
