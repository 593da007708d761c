import { describe, expect, it } from 'vitest';
import { errorTable, IdempotencyError, problemType } from '../src/errors.js';

describe('problem types', () => {
  it('spell every code with dashes, however many words it has (docs/errors.md)', () => {
    expect(problemType('body_too_large')).toBe('https://idem.dev/problems/body-too-large');
    for (const code of Object.keys(errorTable) as Array<keyof typeof errorTable>) {
      const type = new IdempotencyError(code, 'detail').toProblem().type;
      expect(type).toBe(`https://idem.dev/problems/${code.split('_').join('-')}`);
    }
  });
});
