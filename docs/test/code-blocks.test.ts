// Every code block in the documentation is exercised: TypeScript blocks are type-checked against
// the packages' sources (one compiler program for all of them), JSON blocks must parse.
// A block that is deliberately not checkable is fenced as ```text.
//
// A page may declare what its examples assume (a client, a database handle) once, in an HTML
// comment that readers do not see but the checker prepends to each of the page's blocks:
//   <!-- prelude
//   import type { Client } from '@idem/client';
//   declare const api: Client;
//   -->
// A prelude line is left out of a block that itself declares or imports the same name.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const scratch = join(root, 'node_modules', '.cache', 'idem-doc-blocks');

function markdownFiles(): string[] {
  const files = ['README.md'];
  const walk = (dir: string) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory() && entry.name !== 'node_modules' && entry.name !== 'test') walk(path);
      else if (entry.name.endsWith('.md')) files.push(path);
    }
  };
  walk('docs');
  for (const pkg of readdirSync(join(root, 'packages'))) {
    try {
      readFileSync(join(root, 'packages', pkg, 'README.md'));
      files.push(join('packages', pkg, 'README.md'));
    } catch {
      // a package without a README yet
    }
  }
  return files;
}

interface Block {
  file: string;
  line: number;
  lang: string;
  code: string;
  prelude: string[];
}

// The names a line of code declares or imports: `const api`, `function f`, `import { a, b as c }`.
function declaredNames(code: string): Set<string> {
  const names = new Set<string>();
  for (const m of code.matchAll(/\b(?:const|let|var|function|class|interface|type)\s+([A-Za-z_$][\w$]*)/g))
    names.add(m[1] as string);
  for (const m of code.matchAll(/import\s+(?:type\s+)?([\s\S]*?)\s+from\s/g)) {
    const clause = m[1] as string;
    for (const part of clause.replace(/[{}*]/g, ',').split(',')) {
      const name = part
        .trim()
        .split(/\s+as\s+/)
        .pop()
        ?.replace(/^type\s+/, '')
        .trim();
      if (name && /^[A-Za-z_$][\w$]*$/.test(name)) names.add(name);
    }
  }
  return names;
}

function withPrelude(block: Block): string {
  const own = declaredNames(block.code);
  const lines = block.prelude.filter((line) => ![...declaredNames(line)].some((name) => own.has(name)));
  return `${lines.join('\n')}\n${block.code}`;
}

function blocks(file: string): Block[] {
  const text = readFileSync(join(root, file), 'utf8');
  const found: Block[] = [];
  const prelude =
    /<!--\s*prelude\s*\n([\s\S]*?)-->/
      .exec(text)?.[1]
      ?.split('\n')
      .filter((l) => l.trim() !== '') ?? [];
  const fence = /^```([\w+-]*)[^\n]*\n([\s\S]*?)^```\s*$/gm;
  for (let match = fence.exec(text); match; match = fence.exec(text)) {
    const line = text.slice(0, match.index).split('\n').length;
    found.push({ file, line, lang: (match[1] ?? '').toLowerCase(), code: match[2] ?? '', prelude });
  }
  return found;
}

const all = markdownFiles().flatMap(blocks);
const typescriptBlocks = all.filter((b) => ['ts', 'typescript', 'js', 'javascript'].includes(b.lang));
const jsonBlocks = all.filter((b) => b.lang === 'json');

describe('documentation code blocks', () => {
  it('finds the documentation', () => {
    expect(typescriptBlocks.length).toBeGreaterThan(0);
  });

  it('every JSON block parses', () => {
    for (const block of jsonBlocks) {
      expect(() => JSON.parse(block.code), `${block.file}:${block.line}`).not.toThrow();
    }
  });

  it('every TypeScript block type-checks against the packages', () => {
    rmSync(scratch, { recursive: true, force: true });
    mkdirSync(scratch, { recursive: true });
    const names = new Map<string, Block>();
    typescriptBlocks.forEach((block, i) => {
      const name = join(scratch, `${block.file.replace(/[^\w]+/g, '_')}_${block.line}_${i}.ts`);
      // `export {}` makes each block its own module, so blocks may reuse names and use top-level await.
      writeFileSync(name, `${withPrelude(block)}\nexport {};\n`);
      names.set(name, block);
    });
    const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
    const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
    // With exactOptionalPropertyTypes, as a demanding user compiles: a block must work for them too.
    // (Was a defect, found by an audit of the types: stores.md passed `process.env.REDIS_URL`,
    // possibly undefined, as node-redis's `url`.)
    const program = ts.createProgram([...names.keys()], {
      ...parsed.options,
      exactOptionalPropertyTypes: true,
      noEmit: true,
      noUnusedLocals: false,
    });
    const problems = ts
      .getPreEmitDiagnostics(program)
      .filter((d) => d.file && names.has(d.file.fileName))
      .map((d) => {
        const block = names.get(d.file!.fileName)!;
        const { line } = d.file!.getLineAndCharacterOfPosition(d.start ?? 0);
        const shift = withPrelude(block).split('\n').length - block.code.split('\n').length;
        return `${block.file}:${block.line + 1 + line - shift}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
      });
    expect(
      problems,
      `${problems.length} problems in doc blocks (relative to ${relative(process.cwd(), root) || '.'})`,
    ).toEqual([]);
  }, 120_000);
});
