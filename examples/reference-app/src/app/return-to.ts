/**
 * Only same-origin relative paths: `/photos` yes; `//evil.example`, `/\evil.example`, `https://...` no.
 * Anything else becomes `/`, so "return to" can never be an open redirector (RFC 9700 section 4.11).
 *
 * @example
 * ```ts
 * safeReturnTo('/photos?x=1'); // '/photos?x=1'
 * safeReturnTo('//evil.example'); // '/'
 * ```
 */
export function safeReturnTo(value: unknown): string {
  if (typeof value !== 'string' || !value.startsWith('/') || value.startsWith('//') || value.startsWith('/\\'))
    return '/';
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is refused.
  if (/[\u0000-\u001f\\]/.test(value)) return '/';
  return value;
}
