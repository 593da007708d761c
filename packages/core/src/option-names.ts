/**
 * Refuses an options object holding a name its receiver does not know, with the nearest known name
 * when one is close. A misspelt option (`retension`, `storeOutcomes`) would otherwise be ignored and
 * its default used without a word, which TypeScript catches only for object literals.
 *
 * @example
 * assertKnownOptions({ retension: '7d' }, new Set(['retention']), 'idempotency');
 * // TypeError: idempotency: unknown option "retension" (did you mean "retention"?)
 */
export function assertKnownOptions(options: object, known: ReadonlySet<string>, receiver: string): void {
  for (const name of Object.keys(options)) {
    if (known.has(name)) continue;
    const near = nearestName(name, known);
    throw new TypeError(
      `${receiver}: unknown option ${JSON.stringify(name)}${near === undefined ? `; it takes ${[...known].join(', ')}` : ` (did you mean ${JSON.stringify(near)}?)`}`,
    );
  }
}

// The known name fewest edits (insert, delete, replace, ignoring case) away from `name`, if it is
// near enough to be meant: two edits, or one in three letters of a longer name (`maxEntry`).
function nearestName(name: string, known: ReadonlySet<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = Math.max(2, Math.ceil(name.length / 3)) + 1;
  for (const candidate of known) {
    const distance = editDistance(name.toLowerCase(), candidate.toLowerCase());
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(
        (previous[j] as number) + 1,
        (current[j - 1] as number) + 1,
        (previous[j - 1] as number) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = current;
  }
  return previous[b.length] as number;
}

/**
 * `true` when `Names` lists every option of `T`: `const all: ListsEvery<T, typeof names> = true`
 * fails to compile once an option is added to `T` and not to the list that checks it.
 */
export type ListsEvery<T, Names extends readonly PropertyKey[]> = [Exclude<keyof T, Names[number]>] extends [never]
  ? true
  : false;
