/**
 * `value` without the spaces and tabs around it: HTTP's optional white space (RFC 9110 §5.6.3).
 * Not `String#trim`, which also takes 0xA0 (a byte of a value read as latin1) and line breaks; and
 * index loops, not a regex: `[ \t]+$` tries every run of blanks inside the value, quadratic in a
 * hostile header's length.
 *
 * @example
 * trimBlanks(' \t"abc" '); // '"abc"'
 */
export function trimBlanks(value: string): string {
  let start = 0;
  let end = value.length;
  while (start < end && (value.charCodeAt(start) === 0x20 || value.charCodeAt(start) === 0x09)) start++;
  while (end > start && (value.charCodeAt(end - 1) === 0x20 || value.charCodeAt(end - 1) === 0x09)) end--;
  return start === 0 && end === value.length ? value : value.slice(start, end);
}
