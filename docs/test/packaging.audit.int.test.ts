// Audit of the @idem packages as a consumer receives them from npm: every package is packed once
// (docs/test/packed-packages.ts, the same tarballs `npm pack` makes), unpacked, and installed once
// into a fresh project outside the repository (no workspace links, third-party packages from npm).
// Then many small checks: manifests, README links and install lines, type declarations under the
// compiler settings of a Node project, declaration merging as the docs show it, and one more
// install with an isolated node_modules layout (npm's `--install-strategy=linked`, like pnpm's).
//
// What is already checked elsewhere is not repeated here: scripts/test/packages.test.ts (declared
// dependencies, sibling pins, licence, files), docs/test/getting-started.int.test.ts (the page run
// word for word against the tarballs, its files type-checked) and docs/test/code-blocks.test.ts
// (every doc block type-checked, against the sources). The checks marked "Was a defect" failed when
// the audit wrote them; the comment above each says what was wrong.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type CommandRun, consumerEnv, type PackedPackages, packPackages, runIn } from './packed-packages.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');

// Build order: a package after the @idem packages it imports.
const folders = ['core', 'guard', 'client', 'testkit', 'redis', 'postgres', 'express', 'fastify', 'koa', 'webhooks'];

const env = consumerEnv(root);
type Run = CommandRun;
const run = (command: string, args: string[], cwd: string): Promise<Run> => runIn(command, args, cwd, env);

async function npm(args: string[], cwd: string): Promise<void> {
  const done = await run('npm', [...args, '--prefer-offline', '--no-audit', '--no-fund'], cwd);
  if (done.status !== 0) throw new Error(`npm ${args.join(' ')} failed:\n${done.output}`);
}

// `tsc` on files of a consumer project, with the flags of that consumer (strict always). The files of
// the tests that share a project and flags are one tsc run (each run loads @types/node and the
// frameworks' types again: seconds of CPU), started once the projects are installed; each test gets
// the diagnostics of its own file and those that name none of the group's files (a crash, a bad flag),
// so it fails for what its own code meets, as when it was a run of its own.
interface TypecheckGroup {
  /** Adds a file (at collection time); what it returns gives that file's part of the group's run. */
  add(name: string, code: string): () => Promise<Run>;
  start(): Promise<Run>;
}

const groups: TypecheckGroup[] = [];

function typecheckGroup(label: string, cwd: () => string, flags: string[]): TypecheckGroup {
  const files = new Map<string, string>();
  let whole: Promise<Run> | undefined;
  const folder = `check-${label}`;
  const group: TypecheckGroup = {
    add(name, code) {
      if (whole !== undefined) throw new Error(`typecheck group ${label} already ran`);
      files.set(name, code);
      return async () => ownPart(await group.start(), name);
    },
    start() {
      whole ??= (async () => {
        mkdirSync(join(cwd(), folder), { recursive: true });
        const paths = [...files].map(([name, code]) => {
          writeFileSync(join(cwd(), folder, name), code);
          return join(folder, name);
        });
        return run(process.execPath, [tsc, '--noEmit', '--strict', ...flags, ...paths], cwd());
      })();
      return whole;
    },
  };
  // tsc prints `<path>(line,col): error TS...: ...` with its continuation lines indented below it.
  const ownPart = (done: Run, name: string): Run => {
    const mine: string[] = [];
    let keep = true;
    for (const line of done.output.split('\n')) {
      if (line === '') continue;
      if (!/^\s/.test(line)) {
        const about = [...files.keys()].find((file) => line.startsWith(`${folder}/${file}(`));
        keep = about === undefined || about === name;
      }
      if (keep) mine.push(line);
    }
    const output = mine.length === 0 ? '' : `${mine.join('\n')}\n`;
    return { output, status: output === '' ? 0 : done.status || 1 };
  };
  groups.push(group);
  return group;
}

let packed: PackedPackages | undefined;
let scratch = '';
let project = ''; // the consumer project, npm's default (hoisted) layout
let linked = ''; // the same kind of project with an isolated layout
const unpacked = new Map<string, string>(); // package name → its unpacked tarball (the `package/` folder)

function tarball(name: string): string {
  const file = packed?.tarballs.get(name);
  if (file === undefined) throw new Error(`${name} was not packed`);
  return file;
}

beforeAll(async () => {
  packed = await packPackages(root, folders, env);
  scratch = mkdtempSync(join(tmpdir(), 'pkg-audit-'));

  for (const [name, file] of packed.tarballs) {
    const into = join(scratch, 'unpacked', name.replace('/', '__'));
    mkdirSync(into, { recursive: true });
    const untar = await run('tar', ['-xzf', file, '-C', into], scratch);
    if (untar.status !== 0) throw new Error(`tar of ${file} failed:\n${untar.output}`);
    unpacked.set(name, join(into, 'package'));
  }

  // The consumer: the tarballs in place of the names (idem is not on the registry yet), the
  // frameworks at the majors the adapters name, and the type packages a TypeScript user adds.
  project = join(scratch, 'app');
  mkdirSync(project);
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
  const idem = ['core', 'guard', 'client', 'webhooks', 'express', 'fastify', 'koa'].map((f) => tarball(`@idem/${f}`));
  const hoisted = npm(
    ['install', ...idem, 'express@5', 'fastify@5', 'koa@3', '@types/express', '@types/koa', '@types/node'],
    project,
  );

  // The same, as pnpm or `npm --install-strategy=linked` lay it out: a package sees only what it
  // declares. @idem/express and @idem/core, and Express's types; @idem/guard (not on the registry)
  // comes from its tarball, as the dependency of @idem/express it is, not as the project's own.
  linked = join(scratch, 'linked');
  mkdirSync(linked);
  writeFileSync(
    join(linked, 'package.json'),
    JSON.stringify({
      name: 'linked',
      private: true,
      type: 'module',
      overrides: { '@idem/guard': `file:${tarball('@idem/guard')}` },
    }),
  );
  const isolated = npm(
    [
      'install',
      '--install-strategy=linked',
      tarball('@idem/express'),
      tarball('@idem/core'),
      'express@5',
      '@types/express',
      '@types/node',
    ],
    linked,
  );
  // The two installs at once: each waits on npm's cache and the registry more than on a core.
  const installs = await Promise.allSettled([hoisted, isolated]);
  for (const install of installs) if (install.status === 'rejected') throw install.reason;

  // The type checks of the tests below, two at a time, while the first tests run.
  const queue = [...groups];
  const lane = async (): Promise<void> => {
    for (let group = queue.shift(); group !== undefined; group = queue.shift()) await group.start();
  };
  // A failure reaches the tests that await that group.
  void Promise.all([lane(), lane()]).catch(() => undefined);
}, 240_000);

afterAll(() => {
  packed?.remove();
  if (scratch !== '') rmSync(scratch, { recursive: true, force: true });
});

// The compiler settings of a plain Node project (@tsconfig/node22 and the like): Node's types, the
// ECMAScript library without the browser's DOM, declaration files checked.
const nodeProject = ['--module', 'nodenext', '--target', 'es2023', '--lib', 'es2023', '--types', 'node'];

// `Equal<A, B>` is true only for identical types; `check<...>()` fails to compile otherwise.
const typeAssertions = `
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const check = <T extends true>(): void => {};
`;

// The checks of the first block, by project and compiler settings. skipLibCheck where Koa is
// imported: @types/koa 3 itself does not compile against the content-disposition it gets.
// Node's module settings with the default lib (DOM included), as most projects have them.
const nodeDefaultLib = ['--module', 'nodenext', '--target', 'es2023', '--types', 'node'];
const nodeSkipLib = typecheckGroup('node-skiplib', () => project, [...nodeDefaultLib, '--skipLibCheck']);
const nodeOnly = typecheckGroup('node', () => project, nodeProject);
const isolatedLayout = typecheckGroup('isolated', () => linked, nodeDefaultLib);

describe('the packed packages, installed into a project outside the repository', () => {
  // Pinned: what holds today, and was not checked anywhere before.
  it('every installed package loads with import and with require() (Node 22.12+ loads ESM from require)', async () => {
    const names = ['core', 'guard', 'client', 'webhooks', 'express', 'fastify', 'koa'].map((f) => `@idem/${f}`);
    const script = `
      import { createRequire } from 'node:module';
      const require = createRequire(process.cwd() + '/');
      const out = {};
      for (const name of ${JSON.stringify(names)}) {
        const esm = Object.keys(await import(name)).sort();
        const cjs = Object.keys(require(name)).filter((key) => key !== '__esModule' && key !== 'module.exports').sort();
        out[name] = esm.length > 0 && JSON.stringify(esm) === JSON.stringify(cjs);
      }
      console.log(JSON.stringify(out));`;
    const done = await run(process.execPath, ['--input-type=module', '-e', script], project);
    expect(done.status, done.output).toBe(0);
    // The script's one line, wherever stderr put its own: Node 22.12 warns that require() of ES
    // modules is experimental (later 22.x releases do not).
    const line = done.output.split('\n').find((text) => text.startsWith('{"@idem/'));
    expect(JSON.parse(line as string)).toEqual(Object.fromEntries(names.map((name) => [name, true])));
  });

  // Was a defect: tsup strips the `node:` prefix by default, so the packages shipped `from "zlib"`,
  // `from "crypto"`: a bundler for a browser or an edge runtime may then put a polyfill package of
  // that name in its place without a word, where `node:zlib` is refused (or mapped by an explicit flag).
  it("imports Node's built-ins by their node: names only, in every shipped module", () => {
    const bare = new Set(builtinModules.filter((name) => !name.startsWith('_') && !name.startsWith('node:')));
    const found: string[] = [];
    for (const [name, folder] of unpacked) {
      for (const file of readdirSync(join(folder, 'dist'), { recursive: true, encoding: 'utf8' })) {
        if (!file.endsWith('.js')) continue;
        const text = readFileSync(join(folder, 'dist', file), 'utf8');
        for (const match of text.matchAll(
          /(?:\bfrom\s*|\bimport\s*\(\s*|\brequire\s*\(\s*|^import\s+)["']([^"']+)["']/gm,
        )) {
          const specifier = match[1] as string;
          if (bare.has(specifier.split('/')[0] as string)) found.push(`${name}/dist/${file}: ${specifier}`);
        }
      }
    }
    expect(found).toEqual([]);
  });

  // Pinned: the Express and Fastify augmentations, as the READMEs use them, under npm's layout.
  const merging = nodeSkipLib.add(
    'merging.ts',
    `
import type { IdempotencyContext } from '@idem/core';
import { memoryStore } from '@idem/core';
import type { Principal } from '@idem/guard';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import express from 'express';
import Fastify from 'fastify';
${typeAssertions}
const app = express();
app.use(expressIdempotency({ store: memoryStore() }));
app.post('/orders', (req, res) => {
  check<Equal<typeof req.idempotency, IdempotencyContext | undefined>>();
  check<Equal<typeof req.auth, Principal | undefined>>();
  res.end();
});
const server = Fastify();
await server.register(fastifyIdempotency, { store: memoryStore() });
server.post('/orders', { config: { idempotency: { required: false } } }, async (request) => {
  check<Equal<typeof request.idempotency, IdempotencyContext | undefined>>();
  check<Equal<typeof request.auth, Principal | undefined>>();
  return {};
});
export {};
`,
  );
  it('req.idempotency / req.auth (Express) and request.idempotency / request.auth (Fastify) are typed', async () => {
    const done = await merging();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });

  // Was a defect: @idem/client's declarations name `HeadersInit` (the `headers` options of createClient()
  // and of each request), a type of the DOM library only: @types/node has no global of that name.
  // A Node project (lib without "DOM", as @tsconfig/node22 sets it) that checks declaration files
  // gets "Cannot find name 'HeadersInit'" for `import '@idem/client'`, and for `import
  // '@idem/webhooks'`, which imports it; with skipLibCheck the option is silently `any`. The package
  // says it runs in Node. Expected: declarations that compile with Node's types alone (for example
  // `Headers | Record<string, string> | [string, string][]`, or the type of fetch's own parameter).
  const nodeClient = nodeOnly.add(
    'node-client.ts',
    `
import { createClient } from '@idem/client';
import { createSender } from '@idem/webhooks';
const api = createClient({ baseUrl: 'https://api.example', headers: { 'x-tenant': 'a' } });
console.log(api, createSender);
export {};
`,
  );
  it('@idem/client and @idem/webhooks type-check in a Node project without the DOM library', async () => {
    const done = await nodeClient();
    expect(done.output).not.toContain("Cannot find name 'HeadersInit'");
    expect(done.status, done.output).toBe(0);
  });

  // Was a defect: @idem/koa sets ctx.state.auth (guard(), internalAuth()) and ctx.state.idempotency
  // (idempotency()), and the docs use them as typed values (`ctx.state.idempotency.signal` is an
  // AbortSignal, `.tx` the transaction, `.keyFor()`), but unlike @idem/express and @idem/fastify it
  // declares nothing: in a consumer both are `any`, so `ctx.state.idempotency.release()` on a route
  // the middleware does not cover compiles, and with noPropertyAccessFromIndexSignature the README's
  // own `ctx.state.auth?.sub` does not. Expected: the package augments Koa's `DefaultState` (meant
  // for that) with `auth?: Principal` and `idempotency?: IdempotencyContext`, as Express and Fastify
  // get theirs.
  const koaState = nodeSkipLib.add(
    'koa-state.ts',
    `
import type { IdempotencyContext } from '@idem/core';
import { memoryStore } from '@idem/core';
import type { Principal } from '@idem/guard';
import { guard, idempotency } from '@idem/koa';
import Koa from 'koa';
${typeAssertions}
const app = new Koa();
app.use(guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] }));
app.use(idempotency({ store: memoryStore() }));
app.use(async (ctx) => {
  check<Equal<typeof ctx.state.auth, Principal | undefined>>();
  check<Equal<typeof ctx.state.idempotency, IdempotencyContext | undefined>>();
});
export {};
`,
  );
  it('ctx.state.auth and ctx.state.idempotency (Koa) are typed as on Express and Fastify', async () => {
    const done = await koaState();
    expect(done.output).not.toContain('TS2344');
    expect(done.status, done.output).toBe(0);
  });

  // Was a defect: @idem/fastify's manifest accepts any Fastify from 5 on (`"fastify": ">=5"`), but both of
  // its plugins are wrapped by fastify-plugin with `fastify: '5.x'`, which throws
  // FST_ERR_PLUGIN_VERSION_MISMATCH at register() on any other major. With Fastify 6, npm installs
  // without a peer warning and the app fails at startup. Expected: the peer range says what the
  // plugins accept (`^5`), or the plugins accept what the range says.
  it('the fastify peer range of @idem/fastify is one its plugins accept at register()', async () => {
    const script = `
      import { createRequire } from 'node:module';
      import { readFileSync } from 'node:fs';
      import * as plugins from '@idem/fastify';
      const semver = createRequire(process.cwd() + '/')('semver');
      const manifest = JSON.parse(readFileSync('node_modules/@idem/fastify/package.json', 'utf8'));
      const range = manifest.peerDependencies.fastify;
      const out = {};
      for (const name of ['idempotency', 'authPlugin']) {
        const accepted = plugins[name][Symbol.for('plugin-meta')]?.fastify;
        out[name] = { range, accepted, subset: accepted === undefined || semver.subset(range, accepted) };
      }
      console.log(JSON.stringify(out));`;
    const done = await run(process.execPath, ['--input-type=module', '-e', script], project);
    expect(done.status, done.output).toBe(0);
    const plugins = JSON.parse(done.output.trim().split('\n').at(-1) as string) as Record<
      string,
      { range: string; accepted?: string; subset: boolean }
    >;
    for (const [name, { range, accepted, subset }] of Object.entries(plugins)) {
      expect(subset, `peer fastify "${range}", plugin ${name} accepts "${accepted}"`).toBe(true);
    }
  });

  // Was a defect: the READMEs of @idem/express, @idem/fastify and @idem/koa install
  // `@idem/<adapter> @idem/core <framework>`, and their first example imports `requireScopes` from
  // `@idem/guard`, which the install line leaves out. npm's hoisting hides it; under pnpm, Yarn PnP or
  // `npm --install-strategy=linked` the example fails with ERR_MODULE_NOT_FOUND / TS2307 (the
  // isolated project below shows it). Expected: every @idem package a README's code imports is in
  // its install line (or re-exported by the package installed).
  it("each README's install line installs every @idem package its code imports", () => {
    const missing: string[] = [];
    for (const [name, folder] of unpacked) {
      const readme = readFileSync(join(folder, 'README.md'), 'utf8');
      const installed = new Set<string>([name]);
      let hasInstallLine = false;
      for (const [, words] of readme.matchAll(/^npm (?:install|i)\b([^\n#]*)/gm)) {
        hasInstallLine = true;
        for (const word of (words ?? '').trim().split(/\s+/)) installed.add(word);
      }
      if (!hasInstallLine) continue;
      for (const [, code] of readme.matchAll(/^```(?:ts|typescript)[^\n]*\n([\s\S]*?)^```/gm)) {
        for (const [, imported] of (code ?? '').matchAll(/from '(@idem\/[a-z]+)'/g)) {
          if (imported !== undefined && !installed.has(imported)) missing.push(`${name} README: ${imported}`);
        }
      }
    }
    expect([...new Set(missing)]).toEqual([]);
  });

  // Was a defect: @idem/express's and @idem/koa's declarations import `express` / `koa`, which ship
  // no types; a TypeScript project without @types/express or @types/koa gets TS7016, or `any` for
  // every request under skipLibCheck, and neither README said so. Expected: a README whose package's
  // declarations import a package without types of its own installs its @types package.
  it('each README installs the @types package of every typeless package its declarations import', () => {
    const typesOf = (pkg: string): boolean => {
      const manifest = JSON.parse(readFileSync(join(root, 'node_modules', pkg, 'package.json'), 'utf8'));
      const exported = JSON.stringify(manifest.exports ?? {});
      return (
        manifest.types !== undefined ||
        manifest.typings !== undefined ||
        exported.includes('"types"') ||
        existsSync(join(root, 'node_modules', pkg, 'index.d.ts'))
      );
    };
    const missing: string[] = [];
    for (const [name, folder] of unpacked) {
      const installs = [
        ...readFileSync(join(folder, 'README.md'), 'utf8').matchAll(/^npm (?:install|i)\b([^\n#]*)/gm),
      ].flatMap(([, words]) => (words ?? '').trim().split(/\s+/));
      const declarations = readdirSync(join(folder, 'dist'))
        .filter((file) => file.endsWith('.d.ts'))
        .map((file) => readFileSync(join(folder, 'dist', file), 'utf8'))
        .join('\n');
      const imported = new Set(
        // Import and export statements only: the TSDoc examples import packages too.
        [...declarations.matchAll(/^(?:import|export)\b[^;]*?from '([^'./][^']*)'/gm)]
          .map(([, specifier]) => specifier as string)
          .filter((specifier) => !specifier.startsWith('node:') && !specifier.startsWith('@idem/'))
          .filter((specifier) => !builtinModules.includes(specifier))
          .map((specifier) =>
            specifier.startsWith('@')
              ? specifier.split('/').slice(0, 2).join('/')
              : (specifier.split('/')[0] as string),
          ),
      );
      for (const pkg of imported) {
        if (typesOf(pkg)) continue;
        const typesName = `@types/${pkg.startsWith('@') ? pkg.slice(1).replace('/', '__') : pkg}`;
        if (!installs.includes(typesName)) missing.push(`${name} README: ${typesName}`);
      }
    }
    expect(missing).toEqual([]);
  });

  // Was a defect: @idem/express adds `req.auth` and `req.idempotency` with `declare module
  // 'express-serve-static-core'`, a module @idem/express neither depends on nor can resolve from
  // its own folder under an isolated layout (npm `--install-strategy=linked`, Yarn PnP, pnpm without
  // hoisting): there the augmentation is dropped and the documented `req.idempotency?.key` and
  // `req.auth?.sub` are TS2339 errors. Expected: the augmentation targets what every layout
  // resolves, such as the global `Express.Request` interface (which express-serve-static-core's
  // Request extends), so a project that installs @types/express gets the types whatever its layout.
  const isolated = isolatedLayout.add(
    'isolated.ts',
    `
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';
const app = express();
app.use(idempotency({ store: memoryStore(), scope: () => 'demo' }));
app.post('/orders', (req, res) => {
  res.status(201).json({ key: req.idempotency?.key, by: req.auth?.sub });
});
export {};
`,
  );
  it('req.idempotency and req.auth type-check in a project with an isolated node_modules', async () => {
    expect(existsSync(join(linked, 'node_modules', '@idem', 'guard'))).toBe(false);
    const done = await isolated();
    expect(done.output).not.toContain('TS2339');
    expect(done.status, done.output).toBe(0);
  });
});

// The compiler settings of a demanding consumer: a Node project (as above) with every strictness
// flag on. Third-party declarations are skipped (@types/koa itself does not compile so); what the
// consumer writes against ours is the point here.
const strictConsumer = [
  ...nodeProject,
  '--exactOptionalPropertyTypes',
  '--noUncheckedIndexedAccess',
  '--verbatimModuleSyntax',
  '--isolatedModules',
  '--skipLibCheck',
];

const strict = typecheckGroup('strict', () => project, strictConsumer);

// Found by an audit of the types as a strict consumer meets them; each check failed when written.
describe('the packed packages, as a strict TypeScript consumer uses them', () => {
  // Was a defect: `guardRequestFromNode(req)` with the `http.IncomingMessage` it exists for (and the
  // JSDoc's own `const message: NodeRequestLike = req`) fails with TS2379/TS2375 under
  // exactOptionalPropertyTypes, as does `{ headers: req.headers, url: req.url, method: req.method }` for a
  // GuardRequest: @types/node declares `url?: string | undefined`, NodeRequestLike and GuardRequest
  // `url?: string` / `method?: string`; expected: the Node request shape they describe is accepted
  // as is (`url?: string | undefined`, `method?: string | undefined`), without a cast.
  const guardNodeRequest = strict.add(
    'guard-node-request.ts',
    `
import type { IncomingMessage } from 'node:http';
import { createGuard, guardRequestFromNode, type GuardRequest, type NodeRequestLike } from '@idem/guard';
declare const req: IncomingMessage;
const guard = createGuard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] });
const message: NodeRequestLike = req;
const viaNode = await guard.authenticate(guardRequestFromNode(req));
const request: GuardRequest = { headers: req.headers, url: req.url, method: req.method };
const direct = await guard.authenticate(request);
console.log(message, viaNode.ok, direct.ok);
`,
  );
  it('guardRequestFromNode() and GuardRequest accept a Node IncomingMessage under exactOptionalPropertyTypes', async () => {
    const done = await guardNodeRequest();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });

  // Was a defect: PublicKeyInput is `string | Record<string, unknown> | { pem; kid?; alg?: JwsAlgorithm }`:
  // the record member takes any object, so `{ pem, alg: 'RS257' }` and `{ pme: pem }` compile and
  // fail only at run time (the key is dropped or refused), and the typed PEM form checks nothing (the
  // guard's own source casts it back); expected: a typo in a key option is a compile error, e.g. the JWK
  // member typed as jose's `JWK` (which @idem/guard's declarations already import), not any record.
  const publicKeyInput = strict.add(
    'public-key-input.ts',
    `
import { createGuard, createInternalVerifier, type PublicKeyInput } from '@idem/guard';
declare const pem: string;
// @ts-expect-error 'RS257' is no JwsAlgorithm
const badAlg: PublicKeyInput = { pem, kid: '2026-01', alg: 'RS257' };
// @ts-expect-error 'pme' is not 'pem'
const badName: PublicKeyInput = { pme: pem, kid: '2026-01' };
createGuard({
  audience: 'https://api.example',
  // @ts-expect-error 'ES257' is no JwsAlgorithm
  issuers: [{ issuer: 'https://id.example', publicKeys: [{ pem, alg: 'ES257' }] }],
});
// @ts-expect-error 'kdi' is not 'kid'
createInternalVerifier({ issuer: 'https://gw.example', audience: 'orders', keys: [{ pem, kdi: 'gw-1' }] });
// What keys come as still compiles: Node's exported JWK, parsed JSON, PEM text, PEM with its kid.
import { generateKeyPairSync } from 'node:crypto';
const exported = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' });
const parsed: unknown = JSON.parse('{}');
createGuard({
  audience: 'https://api.example',
  issuers: [{ issuer: 'https://id.example', publicKeys: [exported, JSON.parse('{}'), pem, { pem, kid: 'k', alg: 'ES256' }, { ...exported, kid: 'k2', alg: 'ES256' }] }],
});
console.log(badAlg, badName, parsed);
`,
  );
  it('a misspelt PEM key option (publicKeys, keys) is a compile error', async () => {
    const done = await publicKeyInput();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });

  // Was a defect: in a route's handler list, `authorize(...)`, `idempotency(...)` (and `guard()`,
  // `internalAuth()`) of @idem/express are `RequestHandler` with Express's default params, so Express
  // infers the route's params from them instead of from the path: after them `req.params.id` of
  // `app.post('/orders/:id', ...)` is `string | string[]` (TS2322 for `const id: string`), where it is
  // `string` without them or after `express.json()`; the reference app works around it with
  // `String(req.params.id)`. Expected: the middlewares leave the route's params alone (typed as
  // `RequestHandler<any>` or a non-generic handler like connect's, as `express.json()` is).
  const expressRouteParams = strict.add(
    'express-route-params.ts',
    `
import { memoryStore } from '@idem/core';
import { requireRoles, requireScopes } from '@idem/guard';
import { authorize, guard, idempotency } from '@idem/express';
import express from 'express';
const app = express();
const store = memoryStore();
app.use(guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] }));
app.post('/plain/:id', express.json(), (req, res) => {
  const id: string = req.params.id;
  res.json({ id });
});
app.delete('/orders/:id', authorize(requireRoles('admin')), (req, res) => {
  const id: string = req.params.id;
  res.json({ id });
});
app.post('/orders/:id/refunds', authorize(requireScopes('orders:write')), idempotency({ store }), (req, res) => {
  const id: string = req.params.id;
  res.status(201).json({ id, key: req.idempotency?.key });
});
`,
  );
  it("@idem/express middlewares in a route do not widen the route's typed params", async () => {
    const done = await expressRouteParams();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });

  // Was a defect: the `fingerprint` option of every adapter (HttpIdempotencyOptions, Fastify's route
  // `config.idempotency`) is of type HttpFingerprintOptions (`exclude` plus `headers`), which
  // @idem/core declares but does not export (TS2724); the exported FingerprintOptions lacks `headers`,
  // so a shared `const fingerprint: FingerprintOptions = { headers: ['api-version'] }` is refused.
  // Expected: every type that appears in a public option can be named from the package.
  const httpFingerprintOptions = strict.add(
    'http-fingerprint-options.ts',
    `
import { memoryStore, type HttpFingerprintOptions, type HttpIdempotencyOptions } from '@idem/core';
const fingerprint: HttpFingerprintOptions = { exclude: ['/sentAt'], headers: ['api-version'] };
const options: HttpIdempotencyOptions<unknown> = { store: memoryStore(), fingerprint };
console.log(options);
`,
  );
  it("HttpFingerprintOptions, the type of the adapters' `fingerprint` option, is exported by @idem/core", async () => {
    const done = await httpFingerprintOptions();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });

  // Was a defect: GuardEvent's `jwks-key-dropped` and `jwks-rejected` events (and `jwks-fetch`'s reason)
  // carry `reason: KeyDropReason` / `KeySetRejection`, unions @idem/guard declares and documents but
  // does not export (TS2724): a metrics label map `Record<KeyDropReason, string>` cannot name them.
  // Expected: the reason unions of the exported events are exported (as NotStoredReason is by @idem/core).
  const guardEventReasons = strict.add(
    'guard-event-reasons.ts',
    `
import type { GuardEvent, KeyDropReason, KeySetRejection } from '@idem/guard';
const dropped: Record<KeyDropReason, number> = {
  'not-an-object': 0, 'wrong-use': 0, 'wrong-key-ops': 0, 'unknown-alg': 0, 'alg-mismatch': 0, 'alg-not-allowed': 0,
  'no-allowed-alg': 0, 'symmetric-not-allowed': 0, 'weak-key': 0, 'unsupported-key-type': 0, 'invalid-kid': 0, 'invalid-key': 0,
};
const onEvent = (event: GuardEvent): void => {
  if (event.type === 'jwks-key-dropped') dropped[event.reason] += 1;
  if (event.type === 'jwks-rejected') { const reason: KeySetRejection = event.reason; console.log(reason); }
};
console.log(onEvent);
`,
  );
  it('the reason unions of GuardEvent (KeyDropReason, KeySetRejection) are exported by @idem/guard', async () => {
    const done = await guardEventReasons();
    expect(done.output).toBe('');
    expect(done.status).toBe(0);
  });
});
