import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const srcDir = new URL('../src/', import.meta.url);
const files = readdirSync(srcDir).filter((name) => name.endsWith('.ts'));

describe('browser safety of the sources', () => {
  it('has source files to check', () => {
    expect(files.length).toBeGreaterThan(5);
  });

  for (const file of files) {
    it(`${file} uses only web-platform APIs and imports nothing outside the package`, () => {
      const text = readFileSync(new URL(file, srcDir), 'utf8');
      const imports = [...text.matchAll(/\bfrom\s+'([^']+)'/g)].map((m) => m[1]);
      for (const specifier of imports) expect(specifier, `${file} imports ${specifier}`).toMatch(/^\.\/[\w-]+\.js$/);
      // Node-only globals a browser does not have.
      expect(text).not.toMatch(/\b(?:Buffer|process|require|__dirname|setImmediate)\b/);
    });
  }
});
