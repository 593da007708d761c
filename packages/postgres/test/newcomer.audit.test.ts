// Newcomer audit of @idem/postgres as installed from its tarball: docs/stores.md:437 ("You can also
// apply `schema.sql` from the package with your own migration tool") and the package README
// (`await migrate(pool); // or apply schema.sql with your migration tool`) point at a file the
// package ships (package.json `files`) but does not export.
import { createRequire } from 'node:module';
import { expect, it } from 'vitest';

// Was a defect: the exports map has no './schema.sql', so require.resolve / import.meta.resolve of it throw ERR_PACKAGE_PATH_NOT_EXPORTED.
it('schema.sql resolves by its package path, as a migration tool names it', () => {
  // Through the installed package (node_modules/@idem/postgres), as a consumer's require.resolve()
  // or import.meta.resolve() finds it: the exports map has only '.' and './package.json', so Node
  // answers ERR_PACKAGE_PATH_NOT_EXPORTED and the only way in is a path into node_modules.
  const require = createRequire(import.meta.url);
  expect(require.resolve('@idem/postgres/schema.sql')).toMatch(/schema\.sql$/);
});
