// Tests a hand mutation pass found missing: each fails with the mutant named above it and passes
// without it.
import { expect, it } from 'vitest';
import { canonicalJson } from '../src/canonical-json.js';
import { jsonBodyText } from '../src/fingerprint.js';

// Mutant: `prototype !== Object.prototype && prototype !== null` without the null case. A
// null-prototype object is plain JSON data (what `Object.create(null)` parsers and revivers build,
// fast-querystring among them), so it has the canonical form: taken for "not JSON data", the public
// canonicalJson gave undefined and jsonBodyText fell back to the members in insertion order.
it('canonicalJson writes a null-prototype object as any plain object, its members sorted', () => {
  const bare = Object.assign(Object.create(null) as Record<string, unknown>, { b: 1, a: [Object.create(null)] });
  expect(canonicalJson(bare)).toBe('{"a":[{}],"b":1}');
  expect(jsonBodyText(bare)).toBe('{"a":[{}],"b":1}');
});
