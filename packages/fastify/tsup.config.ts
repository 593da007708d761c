import { defineConfig } from 'tsup';

export default defineConfig({
  entry: ['src/index.ts'],
  format: ['esm'],
  dts: true,
  clean: true,
  sourcemap: true,
  target: 'node22',
  // Keep `node:zlib` as written: a bare `zlib` may be swapped for a polyfill by a bundler, silently.
  removeNodeProtocol: false,
});
