import { defineConfig } from 'tsup';

export default defineConfig({
  entry: ['src/index.ts'],
  format: ['esm'],
  dts: true,
  clean: true,
  sourcemap: true,
  target: 'node22',
  // Imports of Node's built-ins keep their `node:` prefix (tsup strips it by default): a bundler for
  // browsers or edge runtimes then refuses `node:zlib` loudly instead of putting a polyfill of a bare
  // `zlib` in its place, and a runtime never mistakes it for a package of that name.
  removeNodeProtocol: false,
});
