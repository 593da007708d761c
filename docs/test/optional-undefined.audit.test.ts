// Options read from configuration, under `exactOptionalPropertyTypes` (a flag the house style asks
// for, and demanding users set): an option whose value may be `undefined`, passed as it is.
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createClient } from '@idem/client';
import { createIdempotency, memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

// What the user writes: every setting optional in their configuration, handed on unchanged.
const userCode = `
import { createIdempotency, memoryStore, type Duration } from '@idem/core';
import { createClient } from '@idem/client';
import { createGuard } from '@idem/guard';
declare const config: { wait?: Duration; retention?: Duration; maxEntries?: number; realm?: string; token?: () => string };
createIdempotency({ store: memoryStore({ maxEntries: config.maxEntries }), wait: config.wait, retention: config.retention });
createClient({ baseUrl: 'https://api.example', getToken: config.token });
createGuard({ audience: 'https://api.example', realm: config.realm, issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] });
export {};
`;

// The repository's compiler options, as a demanding user sets them.
function strictOptions(): ts.CompilerOptions {
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  return { ...parsed.options, exactOptionalPropertyTypes: true, noEmit: true };
}

// A program over real files plus some in-memory ones (the user's code, a fixture).
function programWith(roots: readonly string[], virtual: Readonly<Record<string, string>> = {}): ts.Program {
  const options = strictOptions();
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  host.readFile = (name) => virtual[name] ?? readFile(name);
  host.fileExists = (name) => name in virtual || fileExists(name);
  return ts.createProgram([...roots, ...Object.keys(virtual)], options, host);
}

function typeErrors(code: string): string[] {
  const file = join(root, 'docs', 'test', '__optional-undefined-user.ts');
  const program = programWith([], { [file]: code });
  return ts
    .getPreEmitDiagnostics(program)
    .filter((d) => d.file?.fileName === file)
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n').split('\n')[0] ?? '');
}

// Every public entry of every package: each subpath of package.json "exports" that names a built
// module (./dist/x.js), mapped back to its source (src/x.ts). Data subpaths (schema.sql) have no types.
function publicEntries(): { pkg: string; file: string }[] {
  const entries: { pkg: string; file: string }[] = [];
  for (const dir of readdirSync(join(root, 'packages'))) {
    const manifest = JSON.parse(readFileSync(join(root, 'packages', dir, 'package.json'), 'utf8')) as {
      name: string;
      exports: Record<string, string | { types?: string; default?: string }>;
    };
    for (const target of Object.values(manifest.exports)) {
      const built = typeof target === 'string' ? target : (target.types ?? target.default ?? '');
      const match = /^\.\/dist\/(.+)\.(?:d\.ts|js)$/.exec(built);
      if (match) entries.push({ pkg: manifest.name, file: join(root, 'packages', dir, 'src', `${match[1]}.ts`) });
    }
  }
  return entries;
}

const optionName = /(?:Options|Config|Settings)$/;

// Inputs users hand to idem whose names do not say so, walked as the options types are.
const alsoInputs: Readonly<Record<string, string>> = {
  RouteOverrides: "a route's own `required` and `mintKeys`, over the middleware's",
  RequestParts: 'what fingerprintRequest() hashes',
  BeginInput: "what the engine's begin() takes",
  HttpRequestInfo: "what an adapter's begin() takes",
  StoredResponseLimits: 'the limits assertStoredResponse() checks against',
  WebhookMessage: "what the sender's send() and attempt() take",
  OutboxEvent: "what the outbox's add() takes",
};

interface Walk {
  /** Optional properties whose type lacks `undefined`, as `@idem/pkg TypeName.prop.nested`. */
  missing: string[];
  /** Every optional property looked at, in the same form. */
  checked: string[];
  /** The names of the `opaque` types met (and not walked into). */
  skipped: string[];
}

// Walks the options types a file exports (`entries`), the inline object types of its exported
// functions' and interfaces' methods' parameters, and the object types their properties nest
// (inline object literals, arrays of them, and other types declared in `ownSource`), and lists the
// optional properties whose type does not take `undefined`. The test asks the checker, not the
// source text, so `| undefined` behind an alias, an inherited property, or a Partial<> all count.
function walkOptions(
  program: ts.Program,
  entries: readonly { pkg: string; file: string }[],
  ownSource: (file: string) => boolean,
  opaque: ReadonlySet<string> = new Set(),
): Walk {
  const checker = program.getTypeChecker();
  const undefinedType = checker.getUndefinedType();
  const walk: Walk = { missing: [], checked: [], skipped: [] };
  // Under exactOptionalPropertyTypes the type of `x?: T` is `T | missing`: a second `undefined`
  // type, distinct from the real one, that only an explicit `| undefined` (or any/unknown) adds.
  const takesUndefined = (type: ts.Type): boolean =>
    (type.flags & (ts.TypeFlags.Any | ts.TypeFlags.Unknown)) !== 0 ||
    type === undefinedType ||
    (type.isUnion() && type.types.some(takesUndefined));
  const declaredHere = (type: ts.Type): boolean => {
    const declarations = (type.aliasSymbol ?? type.getSymbol())?.declarations ?? [];
    return declarations.length > 0 && declarations.every((d) => ownSource(d.getSourceFile().fileName));
  };

  const visit = (type: ts.Type, path: string, seen: Set<ts.Type>, top = false): void => {
    if (seen.has(type)) return;
    seen.add(type);
    if (type.isUnion()) {
      for (const member of type.types) visit(member, path, seen);
      return;
    }
    if (checker.isArrayType(type) || checker.isTupleType(type)) {
      for (const element of checker.getTypeArguments(type as ts.TypeReference)) visit(element, path, seen);
      return;
    }
    if (!(type.flags & ts.TypeFlags.Object) && !(type.flags & ts.TypeFlags.Intersection)) return;
    // Functions are called, classes constructed: neither is a bag of settings.
    if (type.getCallSignatures().length > 0 || type.getConstructSignatures().length > 0) return;
    if ((type.getSymbol()?.flags ?? 0) & ts.SymbolFlags.Class) return;
    const anonymous = type.getSymbol()?.name === '__type' && !type.aliasSymbol;
    if (!top && !anonymous && !declaredHere(type)) return;
    const name = (type.aliasSymbol ?? type.getSymbol())?.name ?? '';
    if (!top && opaque.has(name)) {
      walk.skipped.push(name);
      return;
    }
    for (const property of checker.getPropertiesOfType(type)) {
      const where = `${path}.${property.name}`;
      const declaredType = checker.getTypeOfSymbol(property);
      if (property.flags & ts.SymbolFlags.Optional) {
        walk.checked.push(where);
        if (!takesUndefined(declaredType)) walk.missing.push(where);
      }
      visit(checker.getNonNullableType(declaredType), where, seen);
    }
  };

  for (const { pkg, file } of entries) {
    const source = program.getSourceFile(file);
    const module = source && checker.getSymbolAtLocation(source);
    if (!module) throw new Error(`no module for ${relative(root, file)}`);
    for (const exported of checker.getExportsOfModule(module)) {
      const symbol = exported.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exported) : exported;
      // Options written inline in a signature, `f(options: { maxAge?: number })`: an exported
      // function's, or a method's of an exported interface (a client's, a sender's).
      const signatures =
        symbol.flags & ts.SymbolFlags.Function
          ? checker.getTypeOfSymbol(symbol).getCallSignatures()
          : symbol.flags & ts.SymbolFlags.Interface
            ? checker
                .getPropertiesOfType(checker.getDeclaredTypeOfSymbol(symbol))
                .flatMap((member) => checker.getTypeOfSymbol(member).getCallSignatures())
            : [];
      for (const signature of signatures) {
        const owner = signature.getDeclaration()?.name?.getText() ?? exported.name;
        for (const parameter of signature.getParameters()) {
          const type = checker.getNonNullableType(checker.getTypeOfSymbol(parameter));
          const anonymous = type.getSymbol()?.name === '__type' && !type.aliasSymbol;
          const at = `${pkg} ${exported.name === owner ? '' : `${exported.name}.`}${owner}(${parameter.name})`;
          if (anonymous) visit(type, at, new Set());
        }
      }
      if (!optionName.test(exported.name) && !(exported.name in alsoInputs)) continue;
      if (!(symbol.flags & (ts.SymbolFlags.Interface | ts.SymbolFlags.TypeAlias))) continue;
      visit(checker.getDeclaredTypeOfSymbol(symbol), `${pkg} ${exported.name}`, new Set(), true);
    }
  }
  walk.missing = [...new Set(walk.missing)].sort();
  walk.checked = [...new Set(walk.checked)].sort();
  walk.skipped = [...new Set(walk.skipped)].sort();
  return walk;
}

// Types an option refers to that are not settings, so the walk does not go into them, with the reason.
const notSettings: Readonly<Record<string, string>> = {
  Store:
    'the contract idem calls and every store implements (memoryStore() returns one); its optional members describe the store, a user does not set them',
  MemoryStore: 'a Store, as memoryStore() returns it',
};

// Optional properties of public options types that keep a plain `?:` on purpose, with the reason.
const exceptions: Readonly<Record<string, string>> = {
  '@idem/postgres PgQueryConfig.name':
    'the query idem hands to the pg client the user passes (as pg names it), not a setting the user passes to idem',
  '@idem/postgres PgQueryConfig.values': 'the same: what idem hands to the pg client',
  '@idem/webhooks FastifyLikeInstance.addContentTypeParser(options).bodyLimit':
    "fastify's own method, as idem calls it on the user's instance, not a setting the user passes to idem",
};

describe('options that may be undefined, under exactOptionalPropertyTypes', () => {
  it('at run time, an option given as undefined is taken as left out (the default applies)', () => {
    expect(() =>
      createIdempotency({ store: memoryStore({ maxEntries: undefined }), wait: undefined, retention: undefined }),
    ).not.toThrow();
    expect(() => createClient({ baseUrl: 'https://api.example', getToken: undefined })).not.toThrow();
    expect(() =>
      createGuard({
        audience: 'https://api.example',
        realm: undefined,
        issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }],
      }),
    ).not.toThrow();
  });

  // The run time takes `{ wait: undefined }` as "left out" (above), so the types say so too: every
  // optional option is `x?: T | undefined`, and a user under exactOptionalPropertyTypes passes a
  // possibly-undefined setting as it is, with no conditional spread.
  it('the types accept what the run time accepts: a setting that may be undefined, passed as it is', () => {
    expect(typeErrors(userCode)).toEqual([]);
  }, 60_000);

  it('the walk tells `x?: T` from `x?: T | undefined`, through aliases, arrays and nested objects', () => {
    const file = join(root, 'docs', 'test', '__optional-undefined-fixture.ts');
    const fixture = `
      type Maybe<T> = T | undefined;
      interface Entry { plain?: string; taken?: string | undefined }
      export interface FixtureOptions {
        plain?: number;
        taken?: number | undefined;
        aliased?: Maybe<number>;
        loose?: unknown;
        nested?: { plain?: boolean; taken?: boolean | undefined } | undefined;
        entries: readonly Entry[];
        callback?: ((options: { plain?: string }) => void) | undefined;
      }
      export type FixtureConfig = Partial<{ required: string }>;
      export interface Result { plain?: string }
      export function inline(options: { plain?: number; taken?: number | undefined }): void {}
      export interface Thing { method(options?: { plain?: number }): void }
    `;
    const program = programWith([], { [file]: fixture });
    const walk = walkOptions(program, [{ pkg: 'fixture', file }], (name) => name === file);
    expect(walk.missing).toEqual([
      'fixture FixtureConfig.required',
      'fixture FixtureOptions.entries.plain',
      'fixture FixtureOptions.nested.plain',
      'fixture FixtureOptions.plain',
      'fixture Thing.method(options).plain',
      'fixture inline(options).plain',
    ]);
    // Fourteen: not the `plain` in the callback's parameter (a function is not walked into).
    expect(walk.checked).toHaveLength(14);
  }, 60_000);

  it('every optional property of every public options type takes `undefined`, nested ones too', () => {
    const entries = publicEntries();
    const packagesDir = join(root, 'packages');
    const program = programWith(entries.map((e) => e.file));
    const ownSource = (name: string) =>
      !relative(packagesDir, name).startsWith('..') && !name.includes('/node_modules/');
    const walk = walkOptions(program, entries, ownSource, new Set(Object.keys(notSettings)));
    // The walk reaches what it should: a guard issuer entry, a relay's options, the adapters'.
    expect(walk.checked).toEqual(
      expect.arrayContaining([
        '@idem/core IdempotencyOptions.wait',
        '@idem/core MemoryStoreOptions.maxEntries',
        '@idem/guard GuardOptions.issuers.jwksUri',
        '@idem/client ClientOptions.getToken',
        '@idem/webhooks RelayOptions.batchSize',
        '@idem/express ExpressIdempotencyOptions.wait',
      ]),
    );
    expect(walk.missing.filter((where) => !(where in exceptions))).toEqual([]);
    // An exception that no longer applies is removed, not kept to excuse a later regression.
    expect(Object.keys(exceptions).filter((where) => !walk.missing.includes(where))).toEqual([]);
    expect(walk.skipped).toEqual(Object.keys(notSettings).sort());
    // And a type renamed out of `alsoInputs` is noticed, not silently left unwalked.
    const walked = new Set(walk.checked.map((where) => where.split(' ')[1]?.split('.')[0]));
    expect(Object.keys(alsoInputs).filter((name) => !walked.has(name))).toEqual([]);
  }, 120_000);

  // Was a defect: the walk above covered the packages only. The reference app's components are
  // started from configuration too (`createThirdPartyApp`, `startGateway`, `startReferenceApp`...),
  // and some of their optional options (ThirdPartyAppOptions.resource, now, ...) refused an
  // `undefined` under exactOptionalPropertyTypes. The app's own modules only, through each
  // component's index and `start.ts`.
  it("every optional property of the reference app's options types takes `undefined`", () => {
    const appDir = join(root, 'examples', 'reference-app', 'src');
    const entries = ['api', 'app', 'gateway', 'idp', 'receiver', 'schema']
      .map((dir) => ({ pkg: 'reference-app', file: join(appDir, dir, 'index.ts') }))
      .concat({ pkg: 'reference-app', file: join(appDir, 'start.ts') });
    const program = programWith(entries.map((e) => e.file));
    const ownSource = (name: string) => !relative(appDir, name).startsWith('..') && !name.includes('/node_modules/');
    const walk = walkOptions(program, entries, ownSource, new Set(Object.keys(notSettings)));
    expect(walk.checked).toEqual(
      expect.arrayContaining([
        'reference-app ThirdPartyAppOptions.sessionIdleSeconds',
        'reference-app ProviderOptions.sessionIdleSeconds',
      ]),
    );
    expect(walk.missing).toEqual([]);
  }, 120_000);
});
