// toProblem()'s `code` carries the error's code union, so a caller that switches on a problem body
// (a log pipeline, a client mapping problems to messages) is checked for exhaustiveness. The
// type-level lines are checked by `npm run typecheck` (CI); the runtime lines keep the test honest.
import { describe, expect, expectTypeOf, it } from 'vitest';
import { IdempotencyError, type IdempotencyErrorCode } from '../src/index.js';

describe('toProblem().code', () => {
  it('is the IdempotencyErrorCode union, not any string', () => {
    const problem = new IdempotencyError(
      'in_progress',
      'The first request with this key is still running.',
    ).toProblem();
    expectTypeOf(problem.code).toEqualTypeOf<IdempotencyErrorCode>();
    expect(problem.code).toBe('in_progress');
  });
});
