// saysCertificateMissing is exported for callers with a retry or refresh loop of their own: a 401
// invalid_token whose problem says certificate_missing must not make them ask for a new token (it
// lacks the certificate too), while certificate_mismatch (a token cached before a rotation) may.
import { describe, expect, it } from 'vitest';
import { saysCertificateMissing } from '../src/index.js';

describe('saysCertificateMissing', () => {
  it.each([
    [{ code: 'certificate_missing', retryable: false }, true],
    [{ code: 'certificate_missing' }, true],
    [{ code: 'certificate_mismatch', retryable: false }, false],
    [{ code: 'token_expired' }, false],
    [{ error: 'certificate_missing' }, false],
    [{}, false],
  ])('%o: %s', (problem, missing) => {
    expect(saysCertificateMissing(problem)).toBe(missing);
  });

  it('is false without a problem (a body of another type, or none)', () => {
    expect(saysCertificateMissing(undefined)).toBe(false);
  });
});
