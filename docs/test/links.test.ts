// Every relative link in the Markdown the repository ships leads somewhere: the file exists, and a
// `#fragment` names a heading (GitHub's slug of it) or an explicit `<a id>` of that file. Pages are
// moved and headings reworded often; a broken link is found here, not by a reader.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

function shippedMarkdown(): string[] {
  const listed = execFileSync('git', ['ls-files', '-co', '--exclude-standard', '*.md'], {
    cwd: root,
    encoding: 'utf8',
  });
  return listed
    .split('\n')
    .filter((path) => path !== '' && !path.includes('node_modules/') && existsSync(join(root, path)));
}

/** The page's prose: fenced blocks and inline code spans blanked (lines kept), so their brackets are not links. */
function prose(markdown: string): string {
  return markdown
    .replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, (block) => block.replace(/[^\n]/g, ''))
    .replace(/`+[^`\n]*`+/g, '``');
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function anchors(markdown: string): Set<string> {
  const found = new Set<string>();
  const seen = new Map<string, number>();
  const text = markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  for (const [, heading] of text.matchAll(/^#{1,6}[ \t]+(.+?)[ \t#]*$/gm)) {
    const plain = (heading ?? '')
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/<[^>]+>/g, '')
      .replace(/[`*]/g, '')
      .replace(/(^|\s)_+|_+(\s|$)/g, '$1$2');
    const slug = plain
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const count = seen.get(slug) ?? 0;
    seen.set(slug, count + 1);
    found.add(count === 0 ? slug : `${slug}-${count}`);
  }
  for (const [, id] of markdown.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) found.add(id ?? '');
  return found;
}

type Link = { target: string; line: number };

function relativeLinks(markdown: string): Link[] {
  const text = prose(markdown);
  const links: Link[] = [];
  const push = (target: string, index: number) => {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//')) return;
    links.push({ target, line: text.slice(0, index).split('\n').length });
  };
  for (const match of text.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g))
    push(match[1] as string, match.index);
  for (const match of text.matchAll(/^[ \t]*\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t]+"[^"]*")?[ \t]*$/gm))
    push(match[1] as string, match.index);
  for (const match of text.matchAll(/<(?:a|img)\s[^>]*(?:href|src)="([^"]+)"/g)) push(match[1] as string, match.index);
  return links;
}

/** What is wrong with one link of `page`, or undefined when it resolves. */
function brokenReason(page: string, target: string): string | undefined {
  const [pathPart = '', fragment] = target.split('#', 2) as [string, string | undefined];
  const path = decodeURIComponent(pathPart);
  const file = path === '' ? join(root, page) : normalize(join(root, dirname(page), path));
  if (!file.startsWith(root)) return 'points outside the repository';
  if (!existsSync(file)) return 'no such file';
  if (fragment === undefined || fragment === '') return undefined;
  if (statSync(file).isDirectory() || !file.endsWith('.md')) return undefined;
  if (/^L\d+(-L\d+)?$/.test(fragment)) return undefined;
  return anchors(readFileSync(file, 'utf8')).has(decodeURIComponent(fragment).toLowerCase())
    ? undefined
    : 'no heading with that anchor';
}

describe('relative links in the Markdown', () => {
  it('finds the pages and their links', () => {
    const pages = shippedMarkdown();
    expect(pages).toContain('README.md');
    expect(pages).toContain('docs/guides/express.md');
    const count = pages.reduce((sum, page) => sum + relativeLinks(readFileSync(join(root, page), 'utf8')).length, 0);
    expect(count).toBeGreaterThan(100);
  });

  it('slugs headings the way GitHub does', () => {
    const page = [
      '# Express: POST /charges',
      '## `storeOutcome` and `retention`',
      '## Lease versus retention',
      '## Lease versus retention',
      '```md',
      '# not a heading',
      '```',
      '<a id="custom-spot"></a>',
    ].join('\n');
    expect([...anchors(page)]).toEqual([
      'express-post-charges',
      'storeoutcome-and-retention',
      'lease-versus-retention',
      'lease-versus-retention-1',
      'custom-spot',
    ]);
    expect(relativeLinks('see [a](x.md#y) and `[b](z.md)`\n```\n[c](w.md)\n```\n[d]: ./v.md')).toEqual([
      { target: 'x.md#y', line: 1 },
      { target: './v.md', line: 5 },
    ]);
  });

  for (const page of shippedMarkdown()) {
    it(`${page}: every relative link resolves`, () => {
      const broken = relativeLinks(readFileSync(join(root, page), 'utf8'))
        .map((link) => ({ ...link, reason: brokenReason(page, link.target) }))
        .filter((link) => link.reason !== undefined)
        .map((link) => `${page}:${link.line} ${link.target}: ${link.reason}`);
      expect(broken).toEqual([]);
    });
  }
});
