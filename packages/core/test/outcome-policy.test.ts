import { describe, expect, it } from 'vitest';
import { type OutcomePolicy, resolveOutcomePolicy } from '../src/outcome-policy.js';

describe('resolveOutcomePolicy', () => {
  // The presets as concepts.md tables them, at the edges of each range, through the exported
  // resolver (which an app's own policy function may delegate to, as the reference app does).
  it.each([
    ['all', 200, false, true],
    ['all', 500, true, true],
    ['all', 401, false, false],
    ['all', 403, false, false],
    ['all', 429, false, false],
    ['success', 199, false, false],
    ['success', 200, false, true],
    ['success', 299, false, true],
    ['success', 300, false, false],
    ['success', 201, true, false],
    ['stripe', 403, false, true],
    ['stripe', 500, false, true],
    ['stripe', 500, true, false],
    ['stripe', 401, false, false],
    ['stripe', 429, false, false],
  ] as const)('%s: status %i, thrown %s → stored %s', (name, status, thrown, stored) => {
    expect(resolveOutcomePolicy(name)({ status, thrown })).toBe(stored);
  });

  it('hands a function back as it is, and refuses an unknown preset', () => {
    const policy: OutcomePolicy = ({ status }) => status < 500;
    expect(resolveOutcomePolicy(policy)).toBe(policy);
    expect(() => resolveOutcomePolicy('some' as 'all')).toThrow(TypeError);
  });
});
