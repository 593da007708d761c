/**
 * Refuses an options object holding names its receiver does not know. A misspelt rule
 * (`audiance`, `requiredClaim`, `maxTokenAges`) would otherwise be ignored without a word, and a
 * verifier left at its default checks less than the configuration says. TypeScript catches this
 * only for object literals.
 *
 * @example
 * refuseUnknownOptions({ audiance: 'api' }, ['audience'], 'createGuard');
 * // TypeError: createGuard: unknown option "audiance"; it takes audience
 */
export function refuseUnknownOptions(options: object, known: readonly string[], receiver: string): void {
  const unknown = Object.keys(options).filter((name) => !known.includes(name));
  if (unknown.length === 0) return;
  const names = unknown.map((name) => JSON.stringify(name)).join(', ');
  throw new TypeError(
    `${receiver}: unknown option${unknown.length > 1 ? 's' : ''} ${names}; it takes ${known.join(', ')}`,
  );
}

/**
 * `true` when `Names` lists every option of `T`: assigning `true` to it fails to compile once an
 * option is added to `T` and not to the list that checks it.
 */
export type NamesAll<T, Names extends readonly PropertyKey[]> = [Exclude<keyof T, Names[number]>] extends [never]
  ? true
  : false;
