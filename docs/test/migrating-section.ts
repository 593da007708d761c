// Reading one "## From ..." section of docs/migrating.md, for the audits that check it against
// behaviour (migrating-envoy, migrating-stripe): its text, the rows of its two tables, and which rows
// of its "Behaviour differences that matter" table the tests observed.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const page = readFileSync(join(fileURLToPath(new URL('../..', import.meta.url)), 'docs', 'migrating.md'), 'utf8');

/**
 * The section of docs/migrating.md headed `## <heading>`, read from the page as it is now.
 *
 * @example
 * const { section, differenceRow } = migratingSection('From a hand-rolled Stripe-style table');
 */
export function migratingSection(heading: string) {
  const section = (): string => {
    const start = page.indexOf(`\n## ${heading}\n`);
    if (start === -1) throw new Error(`docs/migrating.md has no section "## ${heading}": revisit this audit`);
    const end = page.indexOf('\n## ', start + 1);
    return page.slice(start, end === -1 ? undefined : end);
  };
  const differences = () => section().slice(section().indexOf('### Behaviour differences that matter'));
  const observed = new Set<string>();
  return {
    section,
    /** The section from its "Behaviour differences that matter" heading on. */
    differences,
    /** The labels of the differences rows the tests asked for (see `differenceRow`). */
    observed,
    /** The first cells of the differences table. */
    differenceRows: (): string[] =>
      differences()
        .split('\n')
        .filter((line) => line.startsWith('| ') && !line.startsWith('| |') && !line.startsWith('|---'))
        .map((line) => line.split('|')[1]?.trim() ?? ''),
    /** The whole row of the differences table whose first cell is `label`, marked as observed. */
    differenceRow(label: string): string {
      const line = differences()
        .split('\n')
        .find((row) => row.startsWith(`| ${label} |`));
      if (line === undefined) throw new Error(`"${heading}" has no difference row "${label}": revisit this audit`);
      observed.add(label);
      return line;
    },
    /** The options-table row whose first cell starts with `first`. */
    optionRow(first: string): string {
      const line = section()
        .split('\n')
        .find((row) => row.startsWith(`| ${first}`));
      if (line === undefined) throw new Error(`"${heading}" has no option row "${first}": revisit this audit`);
      return line;
    },
  };
}
