// toProblem()'s `code` carries the error's code union, so a caller that switches on a problem body
// is checked for exhaustiveness. The type-level line is checked by `npm run typecheck` (CI).
import { describe, expect, expectTypeOf, it } from 'vitest';
import { WebhookError, type WebhookErrorCode } from '../src/index.js';

describe('toProblem().code', () => {
  it('is the WebhookErrorCode union, not any string', () => {
    const problem = new WebhookError('signature_mismatch', 'No signature matches.').toProblem();
    expectTypeOf(problem.code).toEqualTypeOf<WebhookErrorCode>();
    expect(problem.code).toBe('signature_mismatch');
  });
});
