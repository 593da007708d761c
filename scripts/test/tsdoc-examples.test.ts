// Every `@example` block in the packages' TSDoc (what an IDE shows on hover) type-checks against
// the sources, in one TypeScript program built from in-memory files, with the repo's compiler
// settings plus `exactOptionalPropertyTypes` (as docs/test/code-blocks.test.ts does: a demanding
// user compiles with it, and an example must work for them too).
//
// Each example becomes its own module next to the file it documents:
//   - its own `import` statements, hoisted to the top (line numbers are kept);
//   - imports of what its reader has in mind, values as values and types with `type`: what its
//     own file exports (an example on an internal helper names the helper), its package's public
//     API, what the package's other files export, and the public API of the idem packages the
//     package depends on; a name from the first that has it, none the example imports itself;
//   - in the framework glue (express, fastify, koa, and webhooks' files of the same names), the
//     framework's objects typed under their usual names (`app`, `req`, `ctx`, `reply`: see
//     `frameworkContext`);
//   - the rest of the example as the body of an `async` function, since most examples are
//     fragments of one: they `return`, they `await`, and they may reuse an imported name locally.
//     A top-level `export` in an example (a Next.js route handler) loses its keyword there.
//
// Fragments use context they do not declare (`app`, `req`, `store`, a `pem`): "Cannot find name"
// is allowed, and so is what follows from it alone (see `undeclared` and `onUntypedCall`). Such a
// name has TypeScript's error type, which accepts any use, so what is checked is what the example
// says about the API: function names, option names, argument counts and types, the types of the
// values it declares. Any other diagnostic fails, named by source file, line and message. An
// example whose point needs the type of its context (a generic inferred from a call on it)
// declares that context.
//
// Not checkable this way:
//   - fenced blocks other than ```ts (an ```text diagram is not code): skipped;
//   - what an example claims in a comment (`// throws TypeError`, `// '["…"]'`): prose, left to the
//     packages' unit tests;
//   - an example that calls an API function which no longer exists, under a name not near any in
//     scope (see `misspelt`): indistinguishable from undeclared context (TS2304), so it passes;
//   - undeclared context whose name is a DOM global (`event`, `name`, `close`: the repo compiles
//     with lib DOM) takes that global's type; it fails only if the use does not fit it.
//
// Two programs are built: the packages alone (for what each file exports), then, reusing its
// parsed files, the one holding every example. On an idle machine this takes a few seconds.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const packagesDir = join(root, 'packages');

// Undeclared fragment context, and only that:
// - TS2304 "Cannot find name 'x'."
// - TS2593 "Cannot find name 'describe'. Do you need to install type definitions for a test runner?"
//   (a testkit example inside a test file's `describe`/`it`, which come from vitest)
// - TS18004 "No value exists in scope for the shorthand property 'x'" (`{ store }` with no `store`)
// Not TS2552 "Cannot find name 'x'. Did you mean 'y'?": a name one typo away from one in scope is
// more likely an API name gone stale than context (and see `misspelt`, which TS2304 must pass too).
const undeclared = new Set([2304, 2593, 18004]);
// Allowed only on a call whose callee has type `any` (undeclared context, or a parameter of a
// callback given to it: `app.post('/x', (req, res) => res.json(…))`), where nothing gives the
// callback's parameters a type: TS7006 "Parameter 'x' implicitly has an 'any' type."
const onUntypedCall = new Set([7006]);

// TypeScript offers "Did you mean" (TS2552) for the first 10 unknown names of a program only, so
// the check is made here, as TypeScript makes it (`getSpellingSuggestion`: a substitution costs 2,
// a change of case 0.1, and the total must stay under 0.4 of the length), against the idem names in
// scope, for a name the example calls, constructs or uses as a type: an undeclared
// `createIdempotence(…)` where `createIdempotency` is imported is an API name gone stale, not
// context. (A value merely passed around, `record` near `recordId`, stays context.) Returns the
// name in scope.
function misspelt(node: ts.Node, api: Exported[]): string | undefined {
  if (!ts.isIdentifier(node) || node.text.length < 3) return undefined;
  const parent = node.parent;
  const asType = ts.isTypeReferenceNode(parent) || ts.isExpressionWithTypeArguments(parent);
  const called = (ts.isCallExpression(parent) || ts.isNewExpression(parent)) && parent.expression === node;
  if (!asType && !called) return undefined;
  const name = node.text;
  const best = Math.floor(name.length * 0.4) + 1;
  return api.find(
    (candidate) =>
      (asType || candidate.value) &&
      Math.abs(candidate.name.length - name.length) <= Math.max(2, Math.floor(name.length * 0.34)) &&
      distance(name, candidate.name) < best - 0.1,
  )?.name;
}

function distance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      const x = a[i - 1] as string;
      const y = b[j - 1] as string;
      const swap = x === y ? 0 : x.toLowerCase() === y.toLowerCase() ? 0.1 : 2;
      row.push(Math.min((previous[j] as number) + 1, (row[j - 1] as number) + 1, (previous[j - 1] as number) + swap));
    }
    previous = row;
  }
  return previous[b.length] as number;
}

// The call a diagnostic at `node` is about: the nearest call or `new` the node is an argument of.
function enclosingCall(node: ts.Node): ts.CallExpression | ts.NewExpression | undefined {
  for (let at: ts.Node | undefined = node; at; at = at.parent) {
    if (ts.isCallExpression(at) || ts.isNewExpression(at)) return at;
    if (ts.isBlock(at) || ts.isSourceFile(at)) return undefined;
  }
  return undefined;
}

function nodeAt(file: ts.SourceFile, position: number): ts.Node {
  const find = (node: ts.Node): ts.Node =>
    ts.forEachChild(node, (child) =>
      child.getStart(file) <= position && position < child.getEnd() ? find(child) : undefined,
    ) ?? node;
  return find(file);
}

interface Example {
  /** Source file, relative to the root. */
  file: string;
  pkg: string;
  /** 1-based line of the example's first code line in the source file. */
  line: number;
  code: string;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((entry) => {
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return path.endsWith('.ts') && !path.endsWith('.d.ts') ? [path] : [];
  });
}

// The `@example` blocks of one file: from the tag to the next tag or the end of the comment, with
// the leading ` * ` stripped and a ```ts fence removed (any other fence is not TypeScript).
function examplesOf(path: string, pkg: string): Example[] {
  const lines = readFileSync(path, 'utf8').split('\n');
  const found: Example[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^\s*\*\s*@example\b/.test(lines[i] as string)) continue;
    const body: string[] = [];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const text = lines[j] as string;
      if (/^\s*\*\/|^\s*\*\s*@\w+/.test(text) || text.includes('*/')) break;
      body.push(text.replace(/^\s*\* ?/, ''));
    }
    let first = i + 2;
    while (body.length > 0 && (body[0] as string).trim() === '') {
      body.shift();
      first++;
    }
    while (body.length > 0 && (body.at(-1) as string).trim() === '') body.pop();
    const fence = /^```(\w*)/.exec((body[0] as string | undefined)?.trim() ?? '');
    if (fence) {
      if (!['ts', 'typescript', ''].includes(fence[1] as string)) continue;
      body.shift();
      first++;
      const close = body.findIndex((l) => l.trim().startsWith('```'));
      if (close >= 0) body.length = close;
    }
    found.push({ file: relative(root, path), pkg, line: first, code: body.join('\n') });
  }
  return found;
}

const packages = readdirSync(packagesDir).filter((name) => statSync(join(packagesDir, name, 'src')).isDirectory());
const examples = packages.flatMap((pkg) =>
  sourceFiles(join(packagesDir, pkg, 'src')).flatMap((path) => examplesOf(path, pkg)),
);

// The idem packages `pkg` depends on (their folder names), as its users have them too.
function dependenciesOf(pkg: string): string[] {
  const manifest = JSON.parse(readFileSync(join(packagesDir, pkg, 'package.json'), 'utf8')) as {
    dependencies?: Record<string, string>;
    peerDependencies?: Record<string, string>;
  };
  return Object.keys({ ...manifest.dependencies, ...manifest.peerDependencies })
    .filter((name) => name.startsWith('@idem/'))
    .map((name) => name.slice('@idem/'.length));
}

// The framework objects a glue example names by their framework's convention, typed: the
// callbacks an example gives `app.post` then get real parameter types, and what it reads off the
// request (`req.auth`, `ctx.state.idempotency`) is checked. Declared around the example, so a name
// the example declares itself wins.
const express = [
  "declare const app: import('express').Express;",
  "declare const req: import('express').Request;",
  "declare const res: import('express').Response;",
];
const fastify = [
  "declare const app: import('fastify').FastifyInstance;",
  "declare const request: import('fastify').FastifyRequest;",
  "declare const reply: import('fastify').FastifyReply;",
];
const koa = ["declare const app: import('koa');", "declare const ctx: import('koa').Context;"];
function frameworkContext(file: string): string[] {
  if (file.startsWith('packages/express/') || file === 'packages/webhooks/src/express.ts') return express;
  if (file.startsWith('packages/fastify/') || file === 'packages/webhooks/src/fastify.ts') return fastify;
  if (file.startsWith('packages/koa/') || file === 'packages/webhooks/src/koa.ts') return koa;
  return [];
}

function compilerOptions(): ts.CompilerOptions {
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  return { ...parsed.options, exactOptionalPropertyTypes: true, noEmit: true, noUnusedLocals: false };
}

const cache = new Map<string, ts.SourceFile>();

// A compiler host over the real file system plus in-memory files, sharing parsed files between the
// two programs below (the second reuses the first's structure).
function hostWith(options: ts.CompilerOptions, virtual: Map<string, string>): ts.CompilerHost {
  const host = ts.createCompilerHost(options, true);
  const { getSourceFile, fileExists, readFile } = host;
  host.fileExists = (name) => virtual.has(name) || fileExists.call(host, name);
  host.readFile = (name) => virtual.get(name) ?? readFile.call(host, name);
  host.getSourceFile = (name, language, onError) => {
    const text = virtual.get(name);
    if (text !== undefined) return ts.createSourceFile(name, text, language, true);
    let file = cache.get(name);
    if (!file) {
      file = getSourceFile.call(host, name, language, onError);
      if (file) cache.set(name, file);
    }
    return file;
  };
  return host;
}

interface Exported {
  name: string;
  value: boolean;
}

function exportsOf(checker: ts.TypeChecker, file: ts.SourceFile | undefined): Exported[] {
  const module = file && checker.getSymbolAtLocation(file);
  if (!module) return [];
  return checker
    .getExportsOfModule(module)
    .filter((symbol) => symbol.name !== 'default')
    .map((symbol) => {
      const target = symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
      return { name: symbol.name, value: (target.flags & ts.SymbolFlags.Value) !== 0 };
    });
}

interface Module {
  example: Example;
  /** Line (0-based) of the generated module where the example's first line is. */
  offset: number;
  text: string;
  /** The idem names imported for it (not those the example imports itself). */
  api: Exported[];
}

/** A module whose exports an example sees, and the specifier it is imported by. */
interface Source {
  specifier: string;
  exports: Exported[];
}

// The example as a module (see the header). Its lines keep their numbers, shifted by `offset`. A
// name comes from the first of `sources` that exports it, unless the example imports it itself.
function moduleOf(example: Example, sources: Source[]): Module {
  const parsed = ts.createSourceFile('example.ts', example.code, ts.ScriptTarget.Latest, true);
  const taken = new Set<string>();
  const hoisted: string[] = [];
  let body = example.code;
  const blank = (start: number, end: number) => {
    body = body.slice(0, start) + body.slice(start, end).replace(/[^\n]/g, ' ') + body.slice(end);
  };
  for (const statement of parsed.statements) {
    if (ts.isImportDeclaration(statement)) {
      const clause = statement.importClause;
      if (clause?.name) taken.add(clause.name.text);
      const bindings = clause?.namedBindings;
      if (bindings && ts.isNamespaceImport(bindings)) taken.add(bindings.name.text);
      if (bindings && ts.isNamedImports(bindings))
        for (const element of bindings.elements) taken.add(element.name.text);
      hoisted.push(statement.getText(parsed).replace(/\n/g, ' '));
      blank(statement.getStart(parsed), statement.getEnd());
    } else {
      const exported = ts.canHaveModifiers(statement)
        ? ts.getModifiers(statement)?.find((m) => m.kind === ts.SyntaxKind.ExportKeyword)
        : undefined;
      if (exported) blank(exported.getStart(parsed), exported.getEnd());
    }
  }
  const api: Exported[] = [];
  const imports = sources.flatMap(({ specifier, exports }) => {
    const names = exports.filter(({ name }) => !taken.has(name));
    for (const { name } of names) taken.add(name);
    api.push(...names);
    if (names.length === 0) return [];
    const list = names.map(({ name, value }) => (value ? name : `type ${name}`)).join(', ');
    return [`import { ${list} } from '${specifier}';`];
  });
  const header = [
    ...hoisted,
    ...imports,
    ...frameworkContext(example.file),
    'export {};',
    'async function example() {',
  ];
  return { example, offset: header.length, text: `${header.join('\n')}\n${body}\n}\nvoid example;\n`, api };
}

describe('TSDoc @example blocks', () => {
  it('finds the examples, none of them empty', () => {
    expect(examples.length).toBeGreaterThan(250);
    expect(examples.filter(({ code }) => code.trim() === '').map(({ file, line }) => `${file}:${line}`)).toEqual([]);
  });

  it('every example type-checks against its package', () => {
    const options = compilerOptions();
    const indexOf = (pkg: string) => join(packagesDir, pkg, 'src', 'index.ts');
    const filesOf = new Map(packages.map((pkg) => [pkg, sourceFiles(join(packagesDir, pkg, 'src'))]));

    // First the packages alone, for what each index and each source file exports.
    const first = ts.createProgram([...filesOf.values()].flat(), options, hostWith(options, new Map()));
    const checker = first.getTypeChecker();
    const exportsOfFile = new Map(
      [...filesOf.values()].flat().map((path) => [path, exportsOf(checker, first.getSourceFile(path))]),
    );

    // Then one program with every example as a module of its own.
    const virtual = new Map<string, string>();
    const modules = new Map<string, Module>();
    examples.forEach((example, i) => {
      const source = join(root, example.file);
      const here = dirname(source);
      const local = (path: string) => `./${relative(here, path).replace(/\.ts$/, '.js')}`;
      const siblings = (filesOf.get(example.pkg) ?? []).filter((path) => path !== source && !path.endsWith('index.ts'));
      const others = dependenciesOf(example.pkg);
      const sources: Source[] = [
        // What the documented file exports, then its package's public API...
        { specifier: local(source), exports: exportsOfFile.get(source) ?? [] },
        { specifier: `@idem/${example.pkg}`, exports: exportsOfFile.get(indexOf(example.pkg)) ?? [] },
        // ...then what its package's other files export (an example on an internal helper calls
        // others), then the public APIs of the idem packages it depends on (an Express example
        // uses requireScopes). Not every package's: `guard` in a guard example is a Guard, not
        // @idem/express's middleware.
        ...siblings.map((path) => ({ specifier: local(path), exports: exportsOfFile.get(path) ?? [] })),
        ...others.map((pkg) => ({ specifier: `@idem/${pkg}`, exports: exportsOfFile.get(indexOf(pkg)) ?? [] })),
      ];
      const name = join(here, `__tsdoc_example_${i}.ts`);
      const module = moduleOf(example, sources);
      virtual.set(name, module.text);
      modules.set(name, module);
    });
    const program = ts.createProgram([...virtual.keys()], options, hostWith(options, virtual), first);
    const types = program.getTypeChecker();
    const isAllowed = (d: ts.Diagnostic, file: ts.SourceFile, module: Module) => {
      if (undeclared.has(d.code))
        return d.start === undefined || misspelt(nodeAt(file, d.start), module.api) === undefined;
      if (!onUntypedCall.has(d.code) || d.start === undefined) return false;
      const call = enclosingCall(nodeAt(file, d.start));
      return call !== undefined && (types.getTypeAtLocation(call.expression).flags & ts.TypeFlags.Any) !== 0;
    };

    const problems: string[] = [];
    for (const [name, module] of modules) {
      const file = program.getSourceFile(name);
      if (!file) throw new Error(`${name} is not in the program`);
      for (const d of [...program.getSyntacticDiagnostics(file), ...program.getSemanticDiagnostics(file)]) {
        if (isAllowed(d, file, module)) continue;
        const { line } = file.getLineAndCharacterOfPosition(d.start ?? 0);
        const at = module.example.line + line - module.offset;
        const near = d.start === undefined ? undefined : misspelt(nodeAt(file, d.start), module.api);
        const hint = near && undeclared.has(d.code) ? ` Did you mean '${near}', which idem exports?` : '';
        const message = ts.flattenDiagnosticMessageText(d.messageText, '\n');
        problems.push(`${module.example.file}:${at}: TS${d.code} ${message}${hint}`);
      }
    }
    expect(problems, `${problems.length} problems in @example blocks`).toEqual([]);
  }, 60_000);
});
