// Every `@example` block in the packages' TSDoc (what an IDE shows on hover) type-checks against
// the sources, in one TypeScript program built from in-memory files, with the repo's compiler
// settings plus `exactOptionalPropertyTypes` (as docs/test/code-blocks.test.ts does: a demanding
// user compiles with it, and an example must work for them too).
//
// Each example becomes its own module next to the file it documents:
//   - its own `import` statements, hoisted to the top (line numbers are kept);
//   - an import of everything its package exports (`@idem/<package>`), and of what its own file
//     exports beyond that (an example on an internal helper names the helper), values as values
//     and types with `type`, less the names the example imports itself;
//   - the rest of the example as the body of an `async` function, since most examples are
//     fragments of one: they `return`, they `await`, and they may reuse an imported name locally.
//     A top-level `export` in an example (a Next.js route handler) loses its keyword there.
//
// Fragments use context they do not declare (`app`, `req`, `store`, a `pem`): "Cannot find name"
// is allowed, and so is what follows from it alone (see `allowed`). Such a name has TypeScript's
// error type, which accepts any use, so what is checked is what the example says about the API:
// function names, option names, argument counts and types, the types of the values it declares.
// Any other diagnostic fails, named by source file, line and message. An example whose point
// needs the type of its context (a generic inferred from a call on it) declares that context.
//
// Not checkable this way: fenced blocks other than ```ts (an ```text diagram is not code) are
// skipped; what an example claims in a comment (`// throws TypeError`, `// '["…"]'`) is prose,
// checked by the packages' unit tests where it matters, not here.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const packagesDir = join(root, 'packages');

// Undeclared fragment context, and only that:
// - TS2304 "Cannot find name 'x'."
// - TS2552 "Cannot find name 'x'. Did you mean 'y'?" (the same, when a name is close to another)
// - TS2582, TS2593 "Cannot find name 'describe'. Do you need to install type definitions for a test
//   runner?" (a testkit example inside a test file's `describe`/`it`, which come from vitest)
// - TS18004 "No value exists in scope for the shorthand property 'x'" (`{ store }` with no `store`)
const undeclared = new Set([2304, 2552, 2582, 2593, 18004]);
// Allowed only on a call whose callee has type `any` (undeclared context, or a parameter of a
// callback given to it: `app.post('/x', (req, res) => res.json(…))`), where nothing gives the
// callback's parameters a type, nor takes type arguments:
// - TS7006 "Parameter 'x' implicitly has an 'any' type.", TS7031 the same for a destructured one;
// - TS2347 "Untyped function calls may not accept type arguments." (`api.post<Charge>(…)`).
const onUntypedCall = new Set([7006, 7031, 2347]);

// The call a diagnostic at `node` is about: the nearest call or `new` the node is an argument of
// (or, for TS2347, is).
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
}

// The example as a module (see the header). Its lines keep their numbers, shifted by `offset`.
function moduleOf(example: Example, fromPackage: Exported[], fromFile: Exported[], specifier: string): Module {
  const parsed = ts.createSourceFile('example.ts', example.code, ts.ScriptTarget.Latest, true);
  const own = new Set<string>();
  const hoisted: string[] = [];
  let body = example.code;
  const blank = (start: number, end: number) => {
    body = body.slice(0, start) + body.slice(start, end).replace(/[^\n]/g, ' ') + body.slice(end);
  };
  for (const statement of parsed.statements) {
    if (ts.isImportDeclaration(statement)) {
      const clause = statement.importClause;
      if (clause?.name) own.add(clause.name.text);
      const bindings = clause?.namedBindings;
      if (bindings && ts.isNamespaceImport(bindings)) own.add(bindings.name.text);
      if (bindings && ts.isNamedImports(bindings)) for (const element of bindings.elements) own.add(element.name.text);
      hoisted.push(statement.getText(parsed).replace(/\n/g, ' '));
      blank(statement.getStart(parsed), statement.getEnd());
    } else {
      const exported = ts.canHaveModifiers(statement)
        ? ts.getModifiers(statement)?.find((m) => m.kind === ts.SyntaxKind.ExportKeyword)
        : undefined;
      if (exported) blank(exported.getStart(parsed), exported.getEnd());
    }
  }
  const clause = (names: Exported[]) =>
    names
      .filter(({ name }) => !own.has(name))
      .map(({ name, value }) => (value ? name : `type ${name}`))
      .join(', ');
  const packageNames = new Set(fromPackage.map(({ name }) => name));
  const header = [
    ...hoisted,
    `import { ${clause(fromPackage)} } from '@idem/${example.pkg}';`,
    `import { ${clause(fromFile.filter(({ name }) => !packageNames.has(name)))} } from '${specifier}';`,
    'export {};',
    'async function example() {',
  ];
  return { example, offset: header.length, text: `${header.join('\n')}\n${body}\n}\nvoid example;\n` };
}

describe('TSDoc @example blocks', () => {
  it('finds the examples', () => {
    expect(examples.length).toBeGreaterThan(250);
  });

  it('every example type-checks against its package', () => {
    const options = compilerOptions();
    const indexOf = (pkg: string) => join(packagesDir, pkg, 'src', 'index.ts');
    const documented = [...new Set(examples.map(({ file }) => join(root, file)))];

    // First the packages alone, for what each index and each documented file exports.
    const bare = new Map<string, string>();
    const first = ts.createProgram([...packages.map(indexOf), ...documented], options, hostWith(options, bare));
    const checker = first.getTypeChecker();
    const packageExports = new Map(packages.map((pkg) => [pkg, exportsOf(checker, first.getSourceFile(indexOf(pkg)))]));
    const fileExports = new Map(documented.map((path) => [path, exportsOf(checker, first.getSourceFile(path))]));

    // Then one program with every example as a module of its own.
    const virtual = new Map<string, string>();
    const modules = new Map<string, Module>();
    examples.forEach((example, i) => {
      const source = join(root, example.file);
      const name = join(dirname(source), `__tsdoc_example_${i}.ts`);
      const specifier = `./${relative(dirname(source), source).replace(/\.ts$/, '.js')}`;
      const module = moduleOf(example, packageExports.get(example.pkg) ?? [], fileExports.get(source) ?? [], specifier);
      virtual.set(name, module.text);
      modules.set(name, module);
    });
    const program = ts.createProgram([...virtual.keys()], options, hostWith(options, virtual), first);
    const types = program.getTypeChecker();
    const isAllowed = (d: ts.Diagnostic, file: ts.SourceFile) => {
      if (undeclared.has(d.code)) return true;
      if (!onUntypedCall.has(d.code) || d.start === undefined) return false;
      const call = enclosingCall(nodeAt(file, d.start));
      return call !== undefined && (types.getTypeAtLocation(call.expression).flags & ts.TypeFlags.Any) !== 0;
    };

    const problems: string[] = [];
    for (const [name, module] of modules) {
      const file = program.getSourceFile(name);
      if (!file) throw new Error(`${name} is not in the program`);
      for (const d of [...program.getSyntacticDiagnostics(file), ...program.getSemanticDiagnostics(file)]) {
        if (isAllowed(d, file)) continue;
        const { line } = file.getLineAndCharacterOfPosition(d.start ?? 0);
        const at = module.example.line + line - module.offset;
        problems.push(
          `${module.example.file}:${at}: TS${d.code} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`,
        );
      }
    }
    expect(problems, `${problems.length} problems in @example blocks`).toEqual([]);
  }, 60_000);
});
