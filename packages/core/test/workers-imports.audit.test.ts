import { builtinModules } from 'node:module';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';
import { describe, expect, it } from 'vitest';

// What a fetch-style runtime without Node (Cloudflare Workers) must provide for each package: the Node
// built-ins that a bundle of its fetch-style entry points still imports. docs/getting-started.md
// ("Other runtimes") states the same lists; a new built-in here changes what Workers users need.
// Bundled from source, for a neutral platform with the conditions a Workers bundler uses.
const packages = ['core', 'client', 'guard', 'webhooks'];
const alias = Object.fromEntries(
  packages.map((name) => [`@idem/${name}`, fileURLToPath(new URL(`../../${name}/src/index.ts`, import.meta.url))]),
);
const builtins = new Set(builtinModules.filter((name) => !name.startsWith('_')));

async function nodeImportsOf(contents: string): Promise<string[]> {
  const result = await esbuild.build({
    stdin: { contents, loader: 'ts', resolveDir: fileURLToPath(new URL('.', import.meta.url)) },
    bundle: true,
    write: false,
    format: 'esm',
    platform: 'neutral',
    conditions: ['worker', 'browser', 'import'],
    mainFields: ['module', 'main'],
    alias,
    metafile: true,
    logLevel: 'silent',
    plugins: [
      {
        name: 'node-builtins',
        setup(build) {
          // `node:x` and a bare `x` alike: a built-in stays an import of the runtime's.
          build.onResolve({ filter: /^[a-z_:/]+$/ }, (args) => {
            const name = args.path.replace(/^node:/, '');
            return builtins.has(name) ? { path: `node:${name}`, external: true } : undefined;
          });
        },
      },
    ],
  });
  const imports = new Set<string>();
  for (const output of Object.values(result.metafile.outputs)) {
    for (const imported of output.imports) if (imported.external) imports.add(imported.path);
  }
  return [...imports].sort();
}

describe('Node built-ins imported by the fetch-style entry points (Cloudflare Workers)', () => {
  it('@idem/client imports none: it runs on Workers without nodejs_compat', async () => {
    expect(await nodeImportsOf("export { createClient, isRequestFailedError } from '@idem/client';")).toEqual([]);
  });

  it('@idem/guard imports node:crypto only', async () => {
    const entry =
      "export { createGuard, createInternalTokenIssuer, createInternalVerifier, verifyInternalToken } from '@idem/guard';";
    expect(await nodeImportsOf(entry)).toEqual(['node:crypto']);
  });

  it('@idem/webhooks fetchWebhook, receiver, sender and signer: buffer, crypto, stream and zlib, no http', async () => {
    const entry =
      "export { createReceiver, createSender, createSigner, createVerifier, fetchWebhook, generateSecret } from '@idem/webhooks'; export { memoryStore } from '@idem/core';";
    expect(await nodeImportsOf(entry)).toEqual(['node:buffer', 'node:crypto', 'node:stream', 'node:zlib']);
  });

  it('@idem/core engine with the memory store: buffer and crypto', async () => {
    const entry =
      "export { createIdempotency, fingerprintRequest, memoryStore, parseIdempotencyKey } from '@idem/core';";
    expect(await nodeImportsOf(entry)).toEqual(['node:buffer', 'node:crypto']);
  });

  // The engine once imported node:http only for validateHeaderName/validateHeaderValue, and workerd's
  // nodejs_compat has node:http only from compatibility date 2025-08-15 (or with the flag
  // enable_nodejs_http_modules): a Worker pinned to an earlier date failed at startup with `No such
  // module "node:http"`. The checks are now local (src/header-syntax.ts), held to Node's by
  // test/header-syntax.property.test.ts.
  it('@idem/core engine with the memory store needs no node:http', async () => {
    const entry =
      "export { createIdempotency, fingerprintRequest, memoryStore, parseIdempotencyKey } from '@idem/core';";
    expect(await nodeImportsOf(entry)).not.toContain('node:http');
  });
});
