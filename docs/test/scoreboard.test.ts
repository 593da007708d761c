// The scoreboard (docs/scoreboard.md) backs each of idem's claims with tests, cited in its idem
// column as `file › test title`. Tests get renamed and moved; a citation of a test that no longer
// exists is found here, not by a reader. The table must also hold the 40 cases, once each.
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = 'docs/scoreboard.md';
const separator = ' › ';

/** The cells of one Markdown table row: split on unescaped pipes, outside code spans. */
function cells(row: string): string[] {
  const found: string[] = [];
  let current = '';
  for (let i = 0; i < row.length; i++) {
    const char = row[i] as string;
    if (char === '\\' && row[i + 1] === '|') {
      current += '|';
      i++;
    } else if (char === '`') {
      // A code span: a run of backticks, then everything up to a run of the same length.
      const fence = /^`+/.exec(row.slice(i))?.[0] as string;
      const end = row.indexOf(fence, i + fence.length);
      const stop = end === -1 ? i + fence.length : end + fence.length;
      current += row.slice(i, stop);
      i = stop - 1;
    } else if (char === '|') {
      found.push(current.trim());
      current = '';
    } else {
      current += char;
    }
  }
  found.push(current.trim());
  // A row starts and ends with a pipe: drop the empty ends.
  return found.slice(1, -1);
}

/** The table of the page: its header cells and its body rows, with the line each row is on. */
function table(markdown: string): { header: string[]; rows: { line: number; cells: string[] }[] } {
  const lines = markdown.split('\n');
  const start = lines.findIndex((line, i) => line.startsWith('|') && /^\|[\s|:-]+\|$/.test(lines[i + 1] ?? ''));
  if (start === -1) throw new Error(`${page}: no table`);
  const header = cells(lines[start] as string);
  const rows: { line: number; cells: string[] }[] = [];
  for (let i = start + 2; i < lines.length && (lines[i] as string).startsWith('|'); i++) {
    rows.push({ line: i + 1, cells: cells(lines[i] as string) });
  }
  return { header, rows };
}

/** The code spans of a cell, as Markdown reads them: one space of padding on each side is dropped. */
function codeSpans(cell: string): string[] {
  const spans: string[] = [];
  for (const match of cell.matchAll(/(`+)([\s\S]*?[^`])\1(?!`)/g)) {
    const content = match[2] as string;
    spans.push(/^ .*[^ ].* $/.test(content) ? content.slice(1, -1) : content);
  }
  return spans;
}

type Citation = { file: string; title: string; row: number };

function citations(markdown: string): Citation[] {
  const { header, rows } = table(markdown);
  const column = header.indexOf('idem');
  if (column === -1) throw new Error(`${page}: no idem column`);
  const found: Citation[] = [];
  for (const row of rows) {
    for (const span of codeSpans(row.cells[column] ?? '')) {
      const at = span.indexOf(separator);
      if (at === -1) continue;
      found.push({ file: span.slice(0, at), title: span.slice(at + separator.length), row: row.line });
    }
  }
  return found;
}

/**
 * The titles of the tests a source file declares, as the source spells them: the first argument of
 * every `it(`, `test(` and their forms (`it.each(...)(`, `it.skipIf(...)(`, and local aliases such as
 * describe-adapter.ts's `itWithClock(`, which is `it` where the store's clock can be moved), when it
 * is a string literal. Escapes are kept as written.
 */
function testTitles(source: string): Set<string> {
  const titles = new Set<string>();
  const call = /\b(?:it|test)(?:[A-Z]\w*)?(?:\.\w+(?:\([^()]*\))?)*\(\s*(['"`])/g;
  for (const match of source.matchAll(call)) {
    const quote = match[1] as string;
    const begin = (match.index as number) + match[0].length;
    let i = begin;
    while (i < source.length && source[i] !== quote) i += source[i] === '\\' ? 2 : 1;
    if (i < source.length) titles.add(source.slice(begin, i));
  }
  return titles;
}

/** What is wrong with one citation, or undefined when the file declares that test. */
function brokenReason(citation: Citation): string | undefined {
  const file = normalize(join(root, citation.file));
  if (!file.startsWith(root) || citation.file.startsWith('/')) return 'not a path inside the repository';
  if (!existsSync(file) || !statSync(file).isFile()) return 'no such file';
  return testTitles(readFileSync(file, 'utf8')).has(citation.title) ? undefined : 'no test with that title';
}

describe('the scoreboard', () => {
  const markdown = readFileSync(join(root, page), 'utf8');

  it('reads titles from every form of test call, quotes and placeholders as written', () => {
    const source = [
      "it('plain', () => {});",
      'it("it\'s double-quoted", () => {});',
      // A template title: its placeholders are read as written, never filled in.
      `it(\`\${n} with a \${kind ? 'template' : "x"}\`, async () => {});`,
      "it.each(table)('%j with %j', () => {});",
      "itWithClock(\n  'on its own line',\n  async () => {},\n);",
      "test.skipIf(slow)('a test() call', () => {});",
      "describe('a suite', () => {}); fit('not a test', () => {}); split('x');",
      "it('escaped \\'quote\\' and \\\\n', () => {});",
    ].join('\n');
    expect([...testTitles(source)]).toEqual([
      'plain',
      "it's double-quoted",
      `\${n} with a \${kind ? 'template' : "x"}`,
      '%j with %j',
      'on its own line',
      'a test() call',
      "escaped \\'quote\\' and \\\\n",
    ]);
  });

  it('reads cells and citations the way Markdown does', () => {
    expect(cells('| 1 | a `x | y` b | c \\| d |')).toEqual(['1', 'a `x | y` b', 'c | d']);
    expect(codeSpans('see `a › b`; `` a › `c` d `` and `plain`')).toEqual(['a › b', 'a › `c` d', 'plain']);
    const sample = ['| # | idem |', '|---|---|', '| 1 | Yes. `f.ts › one`; `f.ts › two` |', '', '| x |'].join('\n');
    expect(citations(sample)).toEqual([
      { file: 'f.ts', title: 'one', row: 3 },
      { file: 'f.ts', title: 'two', row: 3 },
    ]);
  });

  it('has one row for each of the 40 cases, in order', () => {
    const { header, rows } = table(markdown);
    expect(header[0]).toBe('#');
    expect(header.at(-1)).toBe('idem');
    expect(rows.map((row) => row.cells[0])).toEqual(Array.from({ length: 40 }, (_, i) => String(i + 1)));
    for (const row of rows) expect(row.cells, `line ${row.line}`).toHaveLength(header.length);
  });

  it('backs every case with at least one cited test, or says it has none', () => {
    const { header, rows } = table(markdown);
    const column = header.indexOf('idem');
    const cited = new Set(citations(markdown).map((citation) => citation.row));
    const bare = rows
      .filter((row) => !cited.has(row.line) && !/no test/i.test(row.cells[column] ?? ''))
      .map((row) => `case ${row.cells[0]}`);
    expect(bare).toEqual([]);
  });

  it('cites only tests that exist, by their exact title', () => {
    const all = citations(markdown);
    expect(all.length).toBeGreaterThan(40);
    const broken = all
      .map((citation) => ({ ...citation, reason: brokenReason(citation) }))
      .filter((citation) => citation.reason !== undefined)
      .map((citation) => `${page}:${citation.row} ${citation.file} › ${citation.title}: ${citation.reason}`);
    expect(broken).toEqual([]);
  });
});
